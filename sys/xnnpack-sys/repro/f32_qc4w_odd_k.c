// Reproduction against XNNPACK alone (no xnnblob, no weights cache): fp32 activations times a
// qcint4 channelwise filter (zero point 8), through the subgraph API as xnnblob defines it
// (xnn_define_channelwise_quantized_tensor_value_v2 + xnn_define_fully_connected), compared with a
// plain double-precision reference of the dequantized weights.
//
// The filter is [outputs, inputs], two nibbles per byte, the even-indexed input in the low
// nibble, each row starting on a byte. With an odd number of inputs each row's last byte has a
// spare high nibble; it is filled with 0 or with the zero point (8). The reference never reads it.
//
// Each shape runs with the f32_qc4w GEMM XNNPACK picks for this CPU, then with every other
// family of the build forced into the f32_qc4w GEMM config (nr, mr and the kernels; the packing
// function is the same for all of them: xnn_pack_f32_qc4w_gemm_goi_w).
//
// Built and run by run.sh (`run.sh f32_qc4w_odd_k`). Exits 1 when any run is wrong.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xnnpack.h>

#include "xnnpack/config.h"
#include "xnnpack/gemm.h"
#include "xnnpack/hardware-config.h"

enum need { ANY, SSE41, AVX2 };

struct family {
  const char* name;
  enum need need;
  uint8_t mr, nr;
  xnn_f32_qc4w_gemm_minmax_ukernel_fn mr1, mrmax;
};

// The f32_qc4w families each architecture's production build compiles.
static const struct family families[] = {
#if XNN_ARCH_ARM64
    {"aarch64_neonfma_lane_ld128", ANY, 6, 8, xnn_f32_qc4w_gemm_minmax_ukernel_1x8__aarch64_neonfma_lane_ld128,
     xnn_f32_qc4w_gemm_minmax_ukernel_6x8__aarch64_neonfma_lane_ld128},
    {"neon_lane_ld64", ANY, 4, 8, xnn_f32_qc4w_gemm_minmax_ukernel_1x8__neon_lane_ld64,
     xnn_f32_qc4w_gemm_minmax_ukernel_4x8__neon_lane_ld64},
#endif
#if XNN_ARCH_X86_64
    {"avx2_broadcast", AVX2, 3, 16, xnn_f32_qc4w_gemm_minmax_ukernel_1x16__avx2_broadcast,
     xnn_f32_qc4w_gemm_minmax_ukernel_3x16__avx2_broadcast},
    {"sse41_dup", SSE41, 4, 8, xnn_f32_qc4w_gemm_minmax_ukernel_1x8__sse41_dup,
     xnn_f32_qc4w_gemm_minmax_ukernel_4x8__sse41_dup},
#endif
    {"scalar", ANY, 4, 4, xnn_f32_qc4w_gemm_minmax_ukernel_1x4__scalar, xnn_f32_qc4w_gemm_minmax_ukernel_4x4__scalar},
};

static uint32_t rng_state = 2024;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}
static float next_f32(void) { return -1.0f + 2.0f * (float) (next_u32() >> 8) / 16777216.0f; }

enum { ZERO_POINT = 8, OUTPUTS = 6 };

// Runs one fully connected layer of `batch` rows of `inputs` with the given spare nibble and
// returns the largest difference to the reference, in units of what the path may differ by:
// fp32 summation (1e-5 of the sum of the products' magnitudes) or, with `dynamic`, the qd8 path
// (the activations first converted to dynamically quantized int8): half a quantization step of
// each activation times its weight.
static double run_one(size_t batch, size_t inputs, uint8_t spare, int dynamic) {
  const size_t row_bytes = (inputs + 1) / 2;
  uint8_t* nibbles = malloc(OUTPUTS * inputs);
  uint8_t* packed = calloc(OUTPUTS * row_bytes + XNN_EXTRA_BYTES, 1);
  float* x = calloc(batch * inputs + XNN_EXTRA_BYTES / sizeof(float), sizeof(float));
  float* y = calloc(batch * OUTPUTS, sizeof(float));
  float scale[OUTPUTS];
  for (size_t o = 0; o < OUTPUTS; o++) scale[o] = 0.05f + 0.01f * (float) o;
  for (size_t i = 0; i < OUTPUTS * inputs; i++) nibbles[i] = (uint8_t) (next_u32() % 16);
  for (size_t i = 0; i < batch * inputs; i++) x[i] = next_f32();
  for (size_t o = 0; o < OUTPUTS; o++) {
    for (size_t k = 0; k < inputs; k++) {
      packed[o * row_bytes + k / 2] |= (uint8_t) (nibbles[o * inputs + k] << (4 * (k % 2)));
    }
    if (inputs % 2) packed[o * row_bytes + row_bytes - 1] |= (uint8_t) (spare << 4);
  }

  xnn_subgraph_t g = NULL;
  uint32_t in_id, fc_in_id, w_id, out_id;
  const size_t in_dims[2] = {batch, inputs}, w_dims[2] = {OUTPUTS, inputs}, out_dims[2] = {batch, OUTPUTS};
  xnn_runtime_t rt = NULL;
  if (xnn_create_subgraph(2, 0, &g) != xnn_status_success ||
      xnn_define_tensor_value(g, xnn_datatype_fp32, 2, in_dims, NULL, 0, XNN_VALUE_FLAG_EXTERNAL_INPUT, &in_id) !=
          xnn_status_success) {
    fprintf(stderr, "cannot define the input\n");
    exit(2);
  }
  fc_in_id = in_id;
  if (dynamic && (xnn_define_dynamically_quantized_tensor_value(g, xnn_datatype_qdint8, 2, 1, in_dims,
                                                                XNN_INVALID_VALUE_ID, 0, &fc_in_id) !=
                      xnn_status_success ||
                  xnn_define_unary(g, xnn_unary_convert, NULL, in_id, fc_in_id, 0) != xnn_status_success)) {
    fprintf(stderr, "cannot define the dynamic quantization\n");
    exit(2);
  }
  if (
      xnn_define_channelwise_quantized_tensor_value_v2(g, xnn_datatype_qcint4, ZERO_POINT, scale, 2, 0, w_dims,
                                                       packed, XNN_INVALID_VALUE_ID, 0, &w_id) != xnn_status_success ||
      xnn_define_tensor_value(g, xnn_datatype_fp32, 2, out_dims, NULL, 1, XNN_VALUE_FLAG_EXTERNAL_OUTPUT, &out_id) !=
          xnn_status_success ||
      xnn_define_fully_connected(g, -INFINITY, INFINITY, fc_in_id, w_id, XNN_INVALID_VALUE_ID, out_id, 0) !=
          xnn_status_success ||
      xnn_create_runtime_v2(g, NULL, 0, &rt) != xnn_status_success) {
    fprintf(stderr, "cannot define or create the graph\n");
    exit(2);
  }
  const struct xnn_external_value ext[2] = {{0, x}, {1, y}};
  if (xnn_reshape_runtime(rt) != xnn_status_success || xnn_setup_runtime_v2(rt, 2, ext) != xnn_status_success ||
      xnn_invoke_runtime(rt) != xnn_status_success) {
    fprintf(stderr, "cannot run the graph\n");
    exit(2);
  }

  double worst = 0.0;
  for (size_t m = 0; m < batch; m++) {
    float lo = 0.0f, hi = 0.0f;
    for (size_t k = 0; k < inputs; k++) {
      lo = fminf(lo, x[m * inputs + k]);
      hi = fmaxf(hi, x[m * inputs + k]);
    }
    const double half_step = (hi - lo) / 255.0 / 2.0;
    for (size_t o = 0; o < OUTPUTS; o++) {
      double ref = 0.0, bound = 0.0;
      for (size_t k = 0; k < inputs; k++) {
        const double w = ((int) nibbles[o * inputs + k] - ZERO_POINT) * (double) scale[o];
        ref += w * x[m * inputs + k];
        bound += dynamic ? fabs(w) * half_step * 1.01 : fabs(w * x[m * inputs + k]) * 1e-5;
      }
      const double err = fabs(y[m * OUTPUTS + o] - ref) / (bound > 1e-6 ? bound : 1e-6);
      if (err > worst) worst = err;
    }
  }
  xnn_delete_runtime(rt);
  xnn_delete_subgraph(g);
  free(nibbles);
  free(packed);
  free(x);
  free(y);
  return worst;
}

static const char* picked_name(const struct xnn_gemm_config* c) {
  const void* f = (const void*) c->minmax.gemm[c->mr - 1].function[0];
#define NAME(fn) \
  if (f == (const void*) fn) return #fn;
#if XNN_ARCH_ARM64
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_4x8__aarch64_neonfma_lane_ld128)
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_6x8__aarch64_neonfma_lane_ld128)
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_4x8__neon_lane_ld64)
#endif
#if XNN_ARCH_X86_64
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_7x32__avx512skx_broadcast)
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_3x16__avx2_broadcast)
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_3x16__fma3_broadcast)
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_3x16__avx_broadcast)
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_4x8__sse41_dup)
#endif
  NAME(xnn_f32_qc4w_gemm_minmax_ukernel_4x4__scalar)
#undef NAME
  return "(another kernel)";
}

static const size_t inputs_list[] = {1, 2, 3, 5, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33};
static const size_t batches[] = {1, 2, 3, 4, 5, 6, 7};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

// Runs every shape with the given spare nibble, prints one line; returns the number wrong.
static size_t sweep(const char* name, uint8_t spare, int dynamic) {
  size_t wrong = 0;
  char shapes[512] = "";
  for (size_t i = 0; i < COUNT(inputs_list); i++) {
    size_t wrong_batches = 0;
    for (size_t b = 0; b < COUNT(batches); b++) {
      if (run_one(batches[b], inputs_list[i], spare, dynamic) > 1.0) wrong_batches++;
    }
    if (wrong_batches) {
      char one[32];
      snprintf(one, sizeof(one), " k=%zu(%zu/%zu)", inputs_list[i], wrong_batches, COUNT(batches));
      strncat(shapes, one, sizeof(shapes) - strlen(shapes) - 1);
    }
    wrong += wrong_batches;
  }
  printf("%-28s spare nibble %2u: %3zu of %3zu wrong%s\n", name, spare, wrong, COUNT(inputs_list) * COUNT(batches),
         shapes);
  return wrong;
}

int main(void) {
  if (xnn_initialize(NULL) != xnn_status_success) return 2;
  struct xnn_gemm_config* config = (struct xnn_gemm_config*) xnn_init_f32_qc4w_gemm_config();
  if (config == NULL) return 2;
  const struct xnn_gemm_config picked = *config;
  printf("f32 x qc4w, picked: mr %u nr %u, %s\n", picked.mr, picked.nr, picked_name(&picked));

  size_t wrong = 0;
  for (size_t f = 0; f <= COUNT(families); f++) {
    *config = picked;
    const char* name = "picked";
    if (f > 0) {
      const struct family* fam = &families[f - 1];
#if XNN_ARCH_X86_64
      const struct xnn_hardware_config* hw = xnn_init_hardware_config();
      if ((fam->need == SSE41 && !hw->use_x86_sse4_1) || (fam->need == AVX2 && !hw->use_x86_avx2)) {
        printf("%-28s not on this CPU\n", fam->name);
        continue;
      }
#endif
      name = fam->name;
      memset(&config->minmax, 0, sizeof(config->minmax));
      config->minmax.gemm[0] = xnn_init_hmp_gemm_ukernel((xnn_gemm_ukernel_fn) fam->mr1);
      config->minmax.gemm[fam->mr - 1] = xnn_init_hmp_gemm_ukernel((xnn_gemm_ukernel_fn) fam->mrmax);
      config->mr = fam->mr;
      config->nr = fam->nr;
    }
    wrong += sweep(name, 0, 0);
    wrong += sweep(name, ZERO_POINT, 0);
  }
  *config = picked;

  // The same filter behind dynamically quantized activations, for comparison: its packing
  // (xnn_pack_qs8_qc4w_gemm_goi_w) reads the spare nibble as a weight on the CPUs whose qd8
  // config has two planes, so only the zero point is right there. Not counted in the exit code.
  const struct xnn_gemm_config* qd8 = xnn_init_qd8_f32_qc4w_gemm_config();
  printf("qd8 x qc4w (mr %u nr %u kr %u planes %u), for comparison:\n", qd8->mr, qd8->nr, 1u << qd8->log2_kr,
         qd8->planes);
  sweep("picked", 0, 1);
  sweep("picked", ZERO_POINT, 1);
  return wrong != 0;
}
