// XNNPACK's memory plan for a chain of intermediate tensors, against XNNPACK alone: the size of
// the workspace (the arena holding every intermediate tensor) after the runtime is reshaped,
// beside the least any plan can take.
//
// The chain: input -> abs -> a (4 MiB) -> slice -> b (2 MiB) -> slice -> c (1 MiB) -> abs ->
// output. a and b are live together (the first slice reads a and writes b), so are b and c, but
// a and c never are: the least arena is 6 MiB (a and b). Planned largest first: a at 0, b after
// a (at 4 MiB), then c, which overlaps only b in time. The space below b, where a was, is free
// while c lives, so c fits at 0. 4ea82e5's find_value_alloc_offset looks only between and after
// live blocks, never below the first, so it places c after b: a 7 MiB arena. In ResNet-18 the
// same made a 12.4 MiB arena where at most 3.8 MiB are live at once.
//
// Patch 0005 makes the planner look there too (sys/xnnpack-sys/patches/README).
//
// Built and run by run.sh (`run.sh memory_plan`). Exits 1 when the arena is larger than 6 MiB
// (plus XNNPACK's per-tensor padding): unpatched it does.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <xnnpack.h>

#include "xnnpack/subgraph.h"

#define MIB (1024 * 1024)

static void check(enum xnn_status status, const char* what) {
  if (status != xnn_status_success) {
    fprintf(stderr, "%s failed: %d\n", what, (int) status);
    exit(2);
  }
}

static uint32_t tensor(xnn_subgraph_t subgraph, size_t floats, uint32_t external_id,
                       uint32_t flags) {
  uint32_t id = XNN_INVALID_VALUE_ID;
  const size_t dims[1] = {floats};
  check(xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 1, dims, NULL, external_id, flags,
                                &id),
        "xnn_define_tensor_value");
  return id;
}

int main(void) {
  check(xnn_initialize(NULL), "xnn_initialize");
  xnn_subgraph_t subgraph = NULL;
  check(xnn_create_subgraph(2, 0, &subgraph), "xnn_create_subgraph");
  const size_t floats_per_mib = MIB / sizeof(float);
  const uint32_t input = tensor(subgraph, 4 * floats_per_mib, 0, XNN_VALUE_FLAG_EXTERNAL_INPUT);
  const uint32_t a = tensor(subgraph, 4 * floats_per_mib, XNN_INVALID_VALUE_ID, 0);
  const uint32_t b = tensor(subgraph, 2 * floats_per_mib, XNN_INVALID_VALUE_ID, 0);
  const uint32_t c = tensor(subgraph, floats_per_mib, XNN_INVALID_VALUE_ID, 0);
  const uint32_t output = tensor(subgraph, floats_per_mib, 1, XNN_VALUE_FLAG_EXTERNAL_OUTPUT);
  check(xnn_define_unary(subgraph, xnn_unary_abs, NULL, input, a, 0), "abs");
  const size_t offsets[1] = {0};
  const size_t to_b[1] = {2 * floats_per_mib};
  check(xnn_define_static_slice(subgraph, 1, offsets, to_b, a, b, 0), "slice");
  const size_t to_c[1] = {floats_per_mib};
  check(xnn_define_static_slice(subgraph, 1, offsets, to_c, b, c, 0), "slice");
  check(xnn_define_unary(subgraph, xnn_unary_abs, NULL, c, output, 0), "abs");

  xnn_runtime_t runtime = NULL;
  check(xnn_create_runtime_v2(subgraph, NULL, 0, &runtime), "xnn_create_runtime_v2");
  check(xnn_reshape_runtime(runtime), "xnn_reshape_runtime");
  const size_t arena = runtime->workspace->size;
  const size_t least = 6 * MIB;
  printf("workspace %zu bytes (%.2f MiB); a, b and c take %zu bytes, at most %zu live at once\n",
         arena, (double) arena / MIB, (size_t) 7 * MIB, least);
  // XNNPACK pads each tensor by XNN_EXTRA_BYTES and aligns it: allow that, not a whole tensor.
  const int ok = arena <= least + 4 * (XNN_EXTRA_BYTES + 64);
  printf("%s\n", ok ? "planned within the least" : "WRONG: a tensor was placed past free space");
  xnn_delete_runtime(runtime);
  xnn_delete_subgraph(subgraph);
  return ok ? 0 : 1;
}
