// xnnblob's qd8 x qb4w GEMM for aarch64 CPUs with the dot product, as an XNNPACK dqgemm
// microkernel over its 4x16c4 packing: qd8-f32-qb4w-gemm-neondot.S's 4x8 tile (which says what it
// computes and why) over each 16-column group's two halves.
//
// Registered by patches/0027 in the 4-row slot of XNNPACK's qd8_f32_qb4w configuration for
// arm64 CPUs with the dot product and without i8mm, in place of
// xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot: same packing, bit-identical outputs.

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xnnpack/common.h"
#include "xnnpack/microparams.h"

// What the tile reads; the layout qd8-f32-qb4w-gemm-neondot.S states.
struct xnnblob_qd8_qb4w_tile {
  const int8_t* rows[4];
  const float* ksums;
  const uint8_t* weights;
  const float* biases;
  size_t blocks;
  size_t steps;
  // Added to the end of a block's values (two's complement): -16 bytes for the second half.
  size_t scales_at;
  const struct xnn_qd8_quantization_params* quantization;
  float* out;
  size_t out_stride;
  const float* clamp;
};

void xnnblob_qd8_qb4w_dot_4x8(const struct xnnblob_qd8_qb4w_tile* tile);

XNN_INTERNAL void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot(
    size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride, const void* w, float* c,
    size_t cm_stride, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)],
    const struct xnn_qd8_quantization_params
        quantization_params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)]) {
  const size_t bl = params->scalar.blocksize;
  const size_t blocks = kc / bl;
  // 16 k-sums; per block 8 bytes a value of k and 16 bf16 scales; 16 biases.
  const size_t group_bytes = 16 * sizeof(float) + blocks * (bl * 8 + 16 * sizeof(uint16_t)) +
                             16 * sizeof(float);
  float clamp[2] = {params->scalar.min, params->scalar.max};
  struct xnnblob_qd8_qb4w_tile tile = {
      .blocks = blocks,
      .steps = bl / 32,
      .quantization = quantization_params,
      .clamp = clamp,
  };
  // Fewer than 4 rows repeat the last, as XNNPACK's kernels do; the quantization parameters
  // past the batch are padding XNNPACK fills with copies of the last row's.
  for (size_t r = 0; r < 4; r++) {
    tile.rows[r] = (const int8_t*) ((uintptr_t) a + (r < mr ? r : mr - 1) * a_stride);
  }
  const uint8_t* group = w;
  for (size_t n0 = 0; n0 < nc; n0 += 16, group += group_bytes) {
    float* out = (float*) ((uintptr_t) c + (n0 / 16) * cn_stride);
    for (size_t half = 0; half < 2 && n0 + 8 * half < nc; half++) {
      const size_t cols = nc - n0 - 8 * half < 8 ? nc - n0 - 8 * half : 8;
      float scratch[4 * 8];
      const int whole = mr == 4 && cols == 8;
      tile.ksums = (const float*) group + 8 * half;
      tile.weights = group + 16 * sizeof(float) + 32 * half;
      tile.biases = (const float*) (group + group_bytes) - 16 + 8 * half;
      tile.scales_at = (size_t) 0 - 16 * half;
      tile.out = whole ? out + 8 * half : scratch;
      tile.out_stride = whole ? cm_stride : 8 * sizeof(float);
      xnnblob_qd8_qb4w_dot_4x8(&tile);
      if (!whole) {
        for (size_t r = 0; r < mr; r++) {
          memcpy((char*) (out + 8 * half) + r * cm_stride, scratch + 8 * r, cols * sizeof(float));
        }
      }
    }
  }
}
