// xnnblob's qd8 x qb4w GEMMs for aarch64, as XNNPACK dqgemm microkernels over its own 16-column
// packings of blockwise 4-bit weights: 4-row by 8-column tiles over each 16-column group's two
// halves, and a one-row tile of a whole group (the .S files say what they compute and why).
//
// Registered by patches/0027 in XNNPACK's qd8_f32_qb4w configurations for arm64: with the dot
// product (and no i8mm) the 4-row kernel in place of
// xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot, over its c4 packing; without it the
// 4-row and one-row kernels in place of xnn_qd8_f32_qb4w_gemm_minmax_ukernel_6x16__neon_mlal_lane
// and 1x16__neon_mlal_lane, over their kr-1 packing. Same packings, bit-identical outputs.

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xnnpack/common.h"
#include "xnnpack/microparams.h"

// What a tile reads; the layout the .S files state.
struct xnnblob_qd8_qb4w_tile {
  const int8_t* rows[4];
  const float* ksums;
  const uint8_t* weights;
  const float* biases;
  size_t blocks;
  size_t steps;
  // Dot product: added (two's complement) to the end of a block's values to reach this half's
  // scales: -16 bytes for the second half.
  size_t scales_at;
  const struct xnn_qd8_quantization_params* quantization;
  float* out;
  size_t out_stride;
  const float* clamp;
};

typedef void (*tile_fn)(const struct xnnblob_qd8_qb4w_tile* tile);

void xnnblob_qd8_qb4w_dot_4x8(const struct xnnblob_qd8_qb4w_tile* tile);
void xnnblob_qd8_qb4w_mlal_4x8_lo(const struct xnnblob_qd8_qb4w_tile* tile);
void xnnblob_qd8_qb4w_mlal_4x8_hi(const struct xnnblob_qd8_qb4w_tile* tile);
void xnnblob_qd8_qb4w_mlal_1x16(const struct xnnblob_qd8_qb4w_tile* tile);

// How a kernel reads a group: its tiles for columns 0-7 and 8-15, the values of k a step takes,
// and whether a half's first values are 32 bytes into each 64 (c4) or share 16-byte lines (kr 1).
struct kernel {
  tile_fn half[2];
  size_t values_per_step;
  int halves_interleaved;
};

// 16 k-sums; per block 8 bytes a value of k and 16 bf16 scales; 16 biases.
static size_t group_bytes(size_t blocks, size_t bl) {
  return 16 * sizeof(float) + blocks * (bl * 8 + 16 * sizeof(uint16_t)) + 16 * sizeof(float);
}

static void gemm(const struct kernel* kernel, size_t mr, size_t nc, size_t kc, const int8_t* a,
                 size_t a_stride, const void* w, float* c, size_t cm_stride, size_t cn_stride,
                 const struct xnn_f32_qb4w_minmax_params* params,
                 const struct xnn_qd8_quantization_params* quantization_params) {
  const size_t bl = params->scalar.blocksize;
  const size_t blocks = kc / bl;
  const size_t stride = group_bytes(blocks, bl);
  const float clamp[2] = {params->scalar.min, params->scalar.max};
  struct xnnblob_qd8_qb4w_tile tile = {
      .blocks = blocks,
      .steps = bl / kernel->values_per_step,
      .quantization = quantization_params,
      .clamp = clamp,
  };
  // Fewer than 4 rows repeat the last, as XNNPACK's kernels do; the quantization parameters
  // past the batch are padding XNNPACK fills with copies of the last row's.
  for (size_t r = 0; r < 4; r++) {
    tile.rows[r] = (const int8_t*) ((uintptr_t) a + (r < mr ? r : mr - 1) * a_stride);
  }
  const uint8_t* group = w;
  for (size_t n0 = 0; n0 < nc; n0 += 16, group += stride) {
    float* out = (float*) ((uintptr_t) c + (n0 / 16) * cn_stride);
    for (size_t half = 0; half < 2 && n0 + 8 * half < nc; half++) {
      const size_t cols = nc - n0 - 8 * half < 8 ? nc - n0 - 8 * half : 8;
      float scratch[4 * 8];
      const int whole = mr == 4 && cols == 8;
      tile.ksums = (const float*) group + 8 * half;
      tile.weights = group + 16 * sizeof(float) + (kernel->halves_interleaved ? 0 : 32 * half);
      tile.biases = (const float*) (group + stride) - 16 + 8 * half;
      tile.scales_at = (size_t) 0 - 16 * half;
      tile.out = whole ? out + 8 * half : scratch;
      tile.out_stride = whole ? cm_stride : 8 * sizeof(float);
      kernel->half[half](&tile);
      if (!whole) {
        for (size_t r = 0; r < mr; r++) {
          memcpy((char*) (out + 8 * half) + r * cm_stride, scratch + 8 * r, cols * sizeof(float));
        }
      }
    }
  }
}

#if XNN_ENABLE_ARM_DOTPROD
XNN_INTERNAL void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot(
    size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride, const void* w, float* c,
    size_t cm_stride, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)],
    const struct xnn_qd8_quantization_params
        quantization_params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)]) {
  static const struct kernel dot = {
      .half = {xnnblob_qd8_qb4w_dot_4x8, xnnblob_qd8_qb4w_dot_4x8},
      .values_per_step = 32,
      .halves_interleaved = 0,
  };
  gemm(&dot, mr, nc, kc, a, a_stride, w, c, cm_stride, cn_stride, params, quantization_params);
}
#endif  // XNN_ENABLE_ARM_DOTPROD

XNN_INTERNAL void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16__neon_mlal(
    size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride, const void* w, float* c,
    size_t cm_stride, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)],
    const struct xnn_qd8_quantization_params
        quantization_params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)]) {
  static const struct kernel mlal = {
      .half = {xnnblob_qd8_qb4w_mlal_4x8_lo, xnnblob_qd8_qb4w_mlal_4x8_hi},
      .values_per_step = 8,
      .halves_interleaved = 1,
  };
  gemm(&mlal, mr, nc, kc, a, a_stride, w, c, cm_stride, cn_stride, params, quantization_params);
}

XNN_INTERNAL void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_1x16__neon_mlal(
    size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride, const void* w, float* c,
    size_t cm_stride, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)],
    const struct xnn_qd8_quantization_params
        quantization_params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)]) {
  (void) mr;  // 1: the configuration's 1-row slot.
  (void) a_stride;
  (void) cm_stride;
  const size_t bl = params->scalar.blocksize;
  const size_t blocks = kc / bl;
  const size_t stride = group_bytes(blocks, bl);
  const float clamp[2] = {params->scalar.min, params->scalar.max};
  struct xnnblob_qd8_qb4w_tile tile = {
      .rows = {a, a, a, a},
      .blocks = blocks,
      .steps = bl / 8,
      .quantization = quantization_params,
      .clamp = clamp,
  };
  const uint8_t* group = w;
  for (size_t n0 = 0; n0 < nc; n0 += 16, group += stride) {
    float* out = (float*) ((uintptr_t) c + (n0 / 16) * cn_stride);
    const size_t cols = nc - n0 < 16 ? nc - n0 : 16;
    float scratch[16];
    tile.ksums = (const float*) group;
    tile.weights = group + 16 * sizeof(float);
    tile.biases = (const float*) (group + stride) - 16;
    tile.out = cols == 16 ? out : scratch;
    xnnblob_qd8_qb4w_mlal_1x16(&tile);
    if (cols != 16) {
      memcpy(out, scratch, cols * sizeof(float));
    }
  }
}
