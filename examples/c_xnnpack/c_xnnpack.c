/* A plain C program using raw XNNPACK with xnnblob's packed-weight cache: a two-layer fully
 * connected graph whose weights are packed by the first run and found packed by every later one.
 *
 *   c_xnnpack CACHE_FILE [READ_ONLY_LAYER]
 *                            prints "packed=N hits=M" and the outputs (as exact hex floats)
 *
 * Built against an installed xnnblob with CMake (CMakeLists.txt here), and by xnnblob's own
 * tests as a library (XNNBLOB_EXAMPLE_AS_LIBRARY, no main). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <xnnpack.h>

#include "xnnblob.h"

enum { IN = 16, HIDDEN = 32, OUT = 8 };

static float w1[HIDDEN * IN], b1[HIDDEN], w2[OUT * HIDDEN], b2[OUT];

static void fill_weights(void) {
  /* Deterministic, so a second process registers the same bytes. */
  uint32_t state = 12345u;
  for (size_t i = 0; i < sizeof(w1) / sizeof(w1[0]); ++i) {
    state = state * 1664525u + 1013904223u;
    w1[i] = (float)((int32_t)(state >> 9) % 1000) / 4000.0f;
  }
  for (size_t i = 0; i < HIDDEN; ++i) b1[i] = (float)i / 64.0f - 0.25f;
  for (size_t i = 0; i < sizeof(w2) / sizeof(w2[0]); ++i) {
    state = state * 1664525u + 1013904223u;
    w2[i] = (float)((int32_t)(state >> 9) % 1000) / 3000.0f;
  }
  for (size_t i = 0; i < OUT; ++i) b2[i] = 0.125f * (float)i;
}

/* Runs the graph once on a fixed input with the cache at `path` ("" for an in-memory cache),
 * under the read-only cache `layer` when it is not NULL (one made ahead of time: `xnnblob
 * prepack`, or this program's own cold run). Writes the OUT outputs and the cache counters;
 * returns 0, or a negative step number on failure (the C ABI's message is then in
 * xnnblob_last_error()). */
int xnnblob_c_cache_check_layered(const char* path, const char* layer, float* output,
                                  xnnblob_cache_stats* stats) {
  fill_weights();
  if (xnn_initialize(NULL) != xnn_status_success) return -1;
  xnnblob_cache* cache = NULL;
  xnnblob_status status =
      layer ? xnnblob_cache_open_layered(path, &layer, 1, &cache)
      : path[0] ? xnnblob_cache_open_file(path, &cache)
                : xnnblob_cache_open_memory(&cache);
  if (status != XNNBLOB_OK) return -2;
  /* Two threads: XNNPACK's thread-pool calls are served by xnnblob's pool. */
  xnnblob_threadpool* pool = NULL;
  if (xnnblob_threadpool_new(2, &pool) != XNNBLOB_OK) {
    xnnblob_cache_close(cache);
    return -11;
  }

  xnn_subgraph_t subgraph = NULL;
  int result = 0;
  uint32_t x, h, y, w1_id, b1_id, w2_id, b2_id;
  const size_t x_dims[2] = {1, IN}, h_dims[2] = {1, HIDDEN}, y_dims[2] = {1, OUT};
  const size_t w1_dims[2] = {HIDDEN, IN}, b1_dims[1] = {HIDDEN};
  const size_t w2_dims[2] = {OUT, HIDDEN}, b2_dims[1] = {OUT};
  xnn_runtime_t runtime = NULL;
  if (xnn_create_subgraph(2, 0, &subgraph) != xnn_status_success) { result = -3; goto done; }
  /* Registered before XNNPACK sees them: the cache then knows each by its SHA-256. */
  if (xnnblob_cache_register(cache, w1, sizeof(w1), NULL) != XNNBLOB_OK ||
      xnnblob_cache_register(cache, b1, sizeof(b1), NULL) != XNNBLOB_OK ||
      xnnblob_cache_register(cache, w2, sizeof(w2), NULL) != XNNBLOB_OK ||
      xnnblob_cache_register(cache, b2, sizeof(b2), NULL) != XNNBLOB_OK) {
    result = -4;
    goto done;
  }
  if (xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, x_dims, NULL, 0,
                              XNN_VALUE_FLAG_EXTERNAL_INPUT, &x) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, y_dims, NULL, 1,
                              XNN_VALUE_FLAG_EXTERNAL_OUTPUT, &y) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, h_dims, NULL, XNN_INVALID_VALUE_ID,
                              0, &h) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, w1_dims, w1, XNN_INVALID_VALUE_ID,
                              0, &w1_id) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 1, b1_dims, b1, XNN_INVALID_VALUE_ID,
                              0, &b1_id) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 2, w2_dims, w2, XNN_INVALID_VALUE_ID,
                              0, &w2_id) != xnn_status_success ||
      xnn_define_tensor_value(subgraph, xnn_datatype_fp32, 1, b2_dims, b2, XNN_INVALID_VALUE_ID,
                              0, &b2_id) != xnn_status_success ||
      xnn_define_fully_connected(subgraph, 0.0f, INFINITY, x, w1_id, b1_id, h, 0) !=
          xnn_status_success ||
      xnn_define_fully_connected(subgraph, -INFINITY, INFINITY, h, w2_id, b2_id, y, 0) !=
          xnn_status_success) {
    result = -5;
    goto done;
  }
  if (xnn_create_runtime_v4(subgraph, (xnn_weights_cache_t)xnnblob_cache_xnn(cache), NULL,
                            (pthreadpool_t)xnnblob_threadpool_pthreadpool(pool), 0,
                            &runtime) != xnn_status_success) {
    result = -6;
    goto done;
  }
  if (xnnblob_cache_finalize(cache) != XNNBLOB_OK) { result = -7; goto done; }
  /* Maps of the cache file found cut short so far (another process truncated it). */
  size_t lost_before = 0;
  if (xnnblob_cache_lost_maps(cache, &lost_before) != XNNBLOB_OK) { result = -7; goto done; }
  float input[IN];
  for (size_t i = 0; i < IN; ++i) input[i] = (float)i / 8.0f - 1.0f;
  const struct xnn_external_value values[2] = {{0, input}, {1, output}};
  if (xnn_reshape_runtime(runtime) != xnn_status_success ||
      xnn_setup_runtime_v2(runtime, 2, values) != xnn_status_success ||
      xnn_invoke_runtime(runtime) != xnn_status_success) {
    result = -8;
    goto done;
  }
  /* More lost since the runtime was made: it read zeros for packed weights, and the output is
   * not to be used (create the runtime again to pack them anew). */
  size_t lost_after = 0;
  if (xnnblob_cache_lost_maps(cache, &lost_after) != XNNBLOB_OK || lost_after != lost_before) {
    result = -11;
    goto done;
  }
  if (xnnblob_cache_wait_saved(cache) != XNNBLOB_OK) { result = -9; goto done; }
  if (xnnblob_cache_get_stats(cache, stats) != XNNBLOB_OK) { result = -10; goto done; }

done:
  if (runtime) xnn_delete_runtime(runtime);
  if (subgraph) xnn_delete_subgraph(subgraph);
  xnnblob_cache_unregister(cache, w1);
  xnnblob_cache_unregister(cache, b1);
  xnnblob_cache_unregister(cache, w2);
  xnnblob_cache_unregister(cache, b2);
  xnnblob_cache_close(cache);
  xnnblob_threadpool_free(pool);
  return result;
}

/* As xnnblob_c_cache_check_layered, without a layer. */
int xnnblob_c_cache_check(const char* path, float* output, xnnblob_cache_stats* stats) {
  return xnnblob_c_cache_check_layered(path, NULL, output, stats);
}

#ifndef XNNBLOB_EXAMPLE_AS_LIBRARY
int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    fprintf(stderr, "usage: c_xnnpack CACHE_FILE [READ_ONLY_LAYER]\n");
    return 2;
  }
  float output[OUT];
  xnnblob_cache_stats stats;
  int result = xnnblob_c_cache_check_layered(argv[1], argc == 3 ? argv[2] : NULL, output, &stats);
  if (result != 0) {
    fprintf(stderr, "c_xnnpack: failed at step %d: %s\n", -result, xnnblob_last_error());
    return 1;
  }
  printf("packed=%llu hits=%llu\n", (unsigned long long)stats.packed,
         (unsigned long long)stats.hits);
  for (int i = 0; i < OUT; ++i) printf("%a\n", (double)output[i]);
  return 0;
}
#endif
