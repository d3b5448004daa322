// xnnblob's qp8 x qb4w GEMMs for aarch64, as XNNPACK's qp8gemm_bl microkernels: the tiles of
// qp8-f32-qb4w-gemm.S (which says what they compute and why) over a whole m x n, each output
// bit-identical to KleidiAI's kernels on the same packed operands.
//
// Registered by patches/0026 in XNNPACK's qp8_f32_qb4w configuration for i8mm CPUs: the
// prompt kernel in its 16-row slot (any m, in 8-row tiles), the one-row kernel in its 1-row
// slot. The packed layouts (and so the packers, and every cache file) stay KleidiAI's.

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xnnpack/common.h"
#include "xnnpack/microparams.h"

void xnnblob_qp8_qb4w_i8mm_8x4(const int8_t* lhs0, const int8_t* lhs1, const uint8_t* rhs,
                               size_t blocks, size_t chunks, float* dst, size_t dst_stride,
                               const float clamp[2]);
void xnnblob_qp8_qb4w_i8mm_4x4(const int8_t* lhs, const uint8_t* rhs, size_t blocks,
                               size_t chunks, float* dst, size_t dst_stride, const float clamp[2]);
void xnnblob_qp8_qb4w_dot_1x8(const int8_t* lhs, const uint8_t* rhs_a, const uint8_t* rhs_b,
                              size_t blocks, size_t chunks, float dst[8], const float clamp[2]);
void xnnblob_qp8_qb4w_dot_1x4(const int8_t* lhs, const uint8_t* rhs, size_t blocks,
                              size_t chunks, float dst[4], const float clamp[2]);

// Bytes a 4-column group of weights takes: per block its chunks and 4 bf16 scales, then 4 f32
// column sums and 4 f32 biases.
static size_t weights_stride(size_t blocks, size_t chunks) {
  return blocks * (chunks * 64 + 4 * sizeof(uint16_t)) + 8 * sizeof(float);
}

// Copies a tile computed into a dense 4-column scratch where the destination is narrower or
// shorter than the tile.
static void copy_tile(float* dst, size_t dst_stride, const float* tile, size_t rows,
                      size_t cols) {
  for (size_t r = 0; r < rows; r++) {
    memcpy((char*) dst + r * dst_stride, tile + 4 * r, cols * sizeof(float));
  }
}

XNN_INTERNAL void xnnblob_qp8_f32_qb4w_gemm_minmax_ukernel_8x4c16s2__neoni8mm(
    size_t m, size_t n, size_t k, const void* lhs_packed, const void* rhs_packed, float* dst,
    size_t dst_stride_row, size_t dst_stride_col,
    const struct xnn_f32_qb4w_minmax_params params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)]) {
  (void) dst_stride_col;  // XNNPACK's qp8 GEMMs write dense rows.
  const float clamp[2] = {params->scalar.min, params->scalar.max};
  const size_t bl = params->scalar.blocksize;
  const size_t blocks = k / bl;
  const size_t chunks = bl / 32;
  // 4 rows of k int8 values, then 4 int32 offsets and 4 f32 scales.
  const size_t group_stride = 4 * k + 4 * sizeof(int32_t) + 4 * sizeof(float);
  const size_t rhs_stride = weights_stride(blocks, chunks);
  const uint8_t* rhs = rhs_packed;
  for (size_t n0 = 0; n0 < n; n0 += 4, rhs += rhs_stride, dst += 4) {
    const size_t cols = n - n0 < 4 ? n - n0 : 4;
    const int8_t* lhs = lhs_packed;
    float* out = dst;
    for (size_t m0 = 0; m0 < m; m0 += 8) {
      const size_t rows = m - m0 < 8 ? m - m0 : 8;
      float tile[8 * 4];
      const int whole = rows == 8 && cols == 4;
      float* to = whole ? out : tile;
      const size_t to_stride = whole ? dst_stride_row : 4 * sizeof(float);
      if (rows > 4) {
        xnnblob_qp8_qb4w_i8mm_8x4(lhs, lhs + group_stride, rhs, blocks, chunks, to, to_stride,
                                  clamp);
      } else {
        xnnblob_qp8_qb4w_i8mm_4x4(lhs, rhs, blocks, chunks, to, to_stride, clamp);
      }
      if (!whole) {
        copy_tile(out, dst_stride_row, tile, rows, cols);
      }
      lhs += 2 * group_stride;
      out = (float*) ((char*) out + 8 * dst_stride_row);
    }
  }
}

XNN_INTERNAL void xnnblob_qp8_f32_qb4w_gemm_minmax_ukernel_1x8c16s2__aarch64_neondot(
    size_t m, size_t n, size_t k, const void* lhs_packed, const void* rhs_packed, float* dst,
    size_t dst_stride_row, size_t dst_stride_col,
    const struct xnn_f32_qb4w_minmax_params params[XNN_RESTRICT XNN_MIN_ELEMENTS(1)]) {
  (void) dst_stride_col;
  const float clamp[2] = {params->scalar.min, params->scalar.max};
  const size_t bl = params->scalar.blocksize;
  const size_t blocks = k / bl;
  const size_t chunks = bl / 32;
  // k int8 values, then an int32 offset and an f32 scale.
  const size_t row_stride = k + sizeof(int32_t) + sizeof(float);
  const size_t rhs_stride = weights_stride(blocks, chunks);
  for (size_t r = 0; r < m; r++) {
    const int8_t* lhs = (const int8_t*) lhs_packed + r * row_stride;
    const uint8_t* rhs = rhs_packed;
    float* out = (float*) ((char*) dst + r * dst_stride_row);
    size_t n0 = 0;
    for (; n0 + 8 <= n; n0 += 8, rhs += 2 * rhs_stride, out += 8) {
      xnnblob_qp8_qb4w_dot_1x8(lhs, rhs, rhs + rhs_stride, blocks, chunks, out, clamp);
    }
    float tile[8];
    if (n - n0 > 4) {
      xnnblob_qp8_qb4w_dot_1x8(lhs, rhs, rhs + rhs_stride, blocks, chunks, tile, clamp);
      memcpy(out, tile, (n - n0) * sizeof(float));
    } else if (n0 < n) {
      xnnblob_qp8_qb4w_dot_1x4(lhs, rhs, blocks, chunks, tile, clamp);
      memcpy(out, tile, (n - n0) * sizeof(float));
    }
  }
}
