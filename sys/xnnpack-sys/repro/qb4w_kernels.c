// Reproduction against XNNPACK alone (no xnnblob, no weights cache): a qd8 x qb4w fully
// connected operator, run with the microkernels XNNPACK picks for this CPU and with each other
// x86 family of the same build forced into its qb4w GEMM config. Each run is compared with a
// plain C reference computed from the same quantized activations, so quantization of the input
// plays no part: any difference is packing or GEMM.
//
// Two passes:
//  1. quantization parameters as XNNPACK pads them (XNN_EXTRA_QUANTIZATION_PARAMS copies of the
//     last row's, by the convert operator); entries past those hold poison;
//  2. as pass 1, but every entry past the first 10 of padding poisoned: what the released
//     4ea82e5 (XNN_EXTRA_QUANTIZATION_PARAMS 10) gave the kernels.
// A kernel that reads entries past its tile's rows shows in pass 2 whatever the build; with
// enough padding (patches/0001-*) pass 1 is clean.
//
// Built and run by run.sh. Exits 1 when pass 1 has a wrong result.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xnnpack.h>

#include "xnnpack/config.h"
#include "xnnpack/gemm.h"
#include "xnnpack/hardware-config.h"

static uint32_t rng_state = 12345;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}
static float next_f32(float lo, float hi) { return lo + (hi - lo) * (float) (next_u32() >> 8) / 16777216.0f; }

static uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t) (bits >> 16);
}
static float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t) h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

struct family {
  const char* name;
  int available;
  uint32_t mr, nr, log2_kr, planes;
  xnn_dqgemm_ukernel_fn mr1, mrmax;
};

#define PARAMS 64
// Poison for quantization parameters no row owns: a result scaled by it is far off.
static const struct xnn_quantization_params poison = {.zero_point = 100, .scale = 1000.0f};

// Runs one fully connected qd8 x qb4w with quantization parameters valid for the batch and
// `padding` entries after it; returns max |xnnpack - reference| over the outputs.
static double run_case(size_t m, size_t n, size_t k, size_t bl, size_t padding, double* out_range) {
  const size_t blocks = k / bl;
  uint8_t* w = malloc(n * k / 2);
  uint16_t* scales = malloc(n * blocks * sizeof(uint16_t));
  float* bias = malloc(n * sizeof(float));
  float* x = malloc((m * k + 16) * sizeof(float));
  int8_t* xq = malloc(m * k + 16);
  struct xnn_quantization_params qp[PARAMS];
  for (size_t i = 0; i < PARAMS; i++) qp[i] = poison;
  float* y = malloc(n * m * sizeof(float));
  for (size_t i = 0; i < n * k / 2; i++) w[i] = (uint8_t) next_u32();  // two unsigned nibbles (v + 8)
  for (size_t i = 0; i < n * blocks; i++) scales[i] = f32_to_bf16(next_f32(0.001f, 0.05f));
  for (size_t i = 0; i < n; i++) bias[i] = next_f32(-0.5f, 0.5f);
  for (size_t i = 0; i < m * k; i++) x[i] = next_f32(-2.0f, 2.0f);

  xnn_operator_t convert = NULL, fc = NULL;
  if (xnn_create_convert_nc_f32_qd8(0, &convert) != xnn_status_success ||
      xnn_reshape_convert_nc_f32_qd8(convert, m, k, k, k, NULL) != xnn_status_success ||
      xnn_setup_convert_nc_f32_qd8(convert, x, xq, qp) != xnn_status_success ||
      xnn_run_operator(convert, NULL) != xnn_status_success) {
    fprintf(stderr, "convert failed\n");
    exit(2);
  }
  for (size_t i = m + padding; i < PARAMS; i++) qp[i] = poison;
  if (xnn_create_fully_connected_nc_qd8_f32_qb4w(k, n, k, n, bl, 8, scales, w, bias, -INFINITY, INFINITY, 0, NULL,
                                                 NULL, &fc) != xnn_status_success ||
      xnn_reshape_fully_connected_nc_qd8_f32_qb4w(fc, m, NULL) != xnn_status_success ||
      xnn_setup_fully_connected_nc_qd8_f32_qb4w(fc, xq, y, qp) != xnn_status_success ||
      xnn_run_operator(fc, NULL) != xnn_status_success) {
    fprintf(stderr, "fully connected failed\n");
    exit(2);
  }

  double max_diff = 0, range = 0;
  for (size_t r = 0; r < m; r++) {
    for (size_t c = 0; c < n; c++) {
      double acc = bias[c];
      for (size_t b = 0; b < blocks; b++) {
        int64_t s = 0;
        for (size_t j = b * bl; j < (b + 1) * bl; j++) {
          const size_t idx = c * k + j;
          const int nib = (idx & 1) ? (w[idx >> 1] >> 4) : (w[idx >> 1] & 0xF);
          s += (int64_t) ((int) xq[r * k + j] - qp[r].zero_point) * (nib - 8);
        }
        acc += (double) s * bf16_to_f32(scales[c * blocks + b]) * qp[r].scale;
      }
      const double d = fabs(acc - y[r * n + c]);
      if (d > max_diff) max_diff = d;
      if (fabs(acc) > range) range = fabs(acc);
    }
  }
  *out_range = range;
  xnn_delete_operator(fc);
  xnn_delete_operator(convert);
  free(w); free(scales); free(bias); free(x); free(xq); free(y);
  return max_diff;
}

int main(void) {
  if (xnn_initialize(NULL) != xnn_status_success) return 2;
  const struct xnn_hardware_config* hw = xnn_init_hardware_config();
  struct xnn_gemm_config* config = (struct xnn_gemm_config*) xnn_init_qd8_f32_qb4w_gemm_config();
  struct family families[] = {
    {"as dispatched", 1, config->mr, config->nr, config->log2_kr, config->planes, NULL, NULL},
    {"avx512vnnigfni 1x16c8/14x16c8", hw->use_x86_avx512vnnigfni, 14, 16, 3, 2,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x16c8__avx512vnnigfni_prfm,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_14x16c8__avx512vnnigfni_prfm},
    {"avx512vnni 1x16c8/8x16c8", hw->use_x86_avx512vnni, 8, 16, 3, 2,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x16c8__avx512vnni_prfm,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_8x16c8__avx512vnni_prfm},
    {"avx2 1x8c8/3x8c8", hw->use_x86_avx2, 3, 8, 3, 2,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_3x8c8__avx2},
    // xnnblob's one- and four-row kernels (kernels/x86_64, patches/0015-*), on the same packed weights.
    {"avx2 1x8c8/4x8c8 maddubs", hw->use_x86_avx2, 4, 8, 3, 2,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2_maddubs,
     (xnn_dqgemm_ukernel_fn) xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x8c8__avx2_maddubs},
  };
  const struct xnn_gemm_config saved = *config;
  printf("XNN_EXTRA_QUANTIZATION_PARAMS=%d; dispatched qb4w: mr=%u nr=%u kr=%u planes=%u (gfni=%d vnni=%d avx2=%d)\n",
         XNN_EXTRA_QUANTIZATION_PARAMS, config->mr, config->nr, 1u << config->log2_kr, config->planes,
         hw->use_x86_avx512vnnigfni, hw->use_x86_avx512vnni, hw->use_x86_avx2);
  const size_t shapes[][4] = {  // m, n, k, block: every tile remainder of 14 rows, both block sizes
    {1, 64, 64, 32}, {2, 64, 64, 32}, {3, 256, 64, 32}, {4, 48, 128, 64}, {5, 256, 256, 32},
    {13, 64, 256, 256}, {14, 256, 256, 32}, {15, 64, 256, 256}, {16, 48, 128, 64}, {17, 64, 64, 32},
  };
  int failures[2] = {0, 0};
  for (int pass = 0; pass < 2; pass++) {
  const size_t padding = pass == 0 ? XNN_EXTRA_QUANTIZATION_PARAMS : 10;
  printf("pass %d: %zu padded entries valid\n", pass + 1, padding);
  for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
    if (!families[f].available) {
      printf("%-34s not available on this CPU\n", families[f].name);
      continue;
    }
    *config = saved;
    if (families[f].mr1 != NULL) {
      memset(&config->minmax, 0, sizeof(config->minmax));
      config->minmax.dqgemm[0] = xnn_init_hmp_dqgemm_ukernel(families[f].mr1);
      config->minmax.dqgemm[families[f].mr - 1] = xnn_init_hmp_dqgemm_ukernel(families[f].mrmax);
      config->mr = families[f].mr;
      config->nr = families[f].nr;
      config->log2_kr = families[f].log2_kr;
      config->planes = families[f].planes;
    }
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
      double range;
      rng_state = 12345 + (uint32_t) s;
      const double diff = run_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], padding, &range);
      const int bad = !(diff <= 1e-4 * range + 1e-5);
      failures[pass] += bad;
      printf("  %-32s m=%-2zu n=%-3zu k=%-3zu bl=%-3zu max|xnnpack-ref|=%-9.3g of %-5.3g %s\n", families[f].name,
             shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], diff, range, bad ? "WRONG" : "ok");
    }
  }
  }
  *config = saved;
  printf("pass 1 (as XNNPACK pads): %d wrong; pass 2 (10 entries of padding): %d wrong\n", failures[0],
         failures[1]);
  return failures[0] != 0;
}
