// xnnblob's qd8 x qb4w GEMMs for x86-64 CPUs with AVX512-VNNI, as XNNPACK dqgemm microkernels
// over XNNPACK's 16-column c4 packing of blockwise 4-bit weights (nr 16, kr 4, two nibble
// planes): 1, 4, 8 and 12 rows by 16 columns.
//
// Registered by patches/0028 in XNNPACK's qd8_f32_qb4w configurations for AVX512-VNNI, in place
// of XNNPACK's c8 kernels (xnn_qd8_f32_qb4w_gemm_minmax_ukernel_*x16c8__avx512vnni{,gfni}_prfm).
//
// Why: the multiply, VPDPBUSD, takes unsigned bytes times signed ones, so XNNPACK's kernels flip
// the sign bit of each signed activation as they broadcast it, once per row, per 8 values of k,
// per 16 columns; and the c8 packing gives each column two 32-bit sums per 8 values of k, so
// every block of k ends with a pairwise add and a permute per row before the sums are scaled.
// Counted per row and block of 32 values of k, those two are 9 of the 20 vector operations of
// XNNPACK's kernels (8 of them multiplies), and on Intel's server cores they issue on the ports
// the multiplies need. Here each call flips the sign bits of its rows once, into a buffer on the
// stack, and the c4 packing gives each column one sum (a column's 32-bit lane takes four values
// of k at a time), so a block ends with a conversion and a fused multiply-add per row.
//
// The arithmetic is XNNPACK's: per block of k, the exact integer sum of (weight nibble - 8) * 16
// times (activation + 128), converted to float and multiplied by the block's scale into an
// accumulator that starts at the columns' k-sums times (zero point + 128); then the row's inverse
// scale, the bias and the clamp, in that order. Integer sums do not depend on the order they are
// added in, so the outputs are bit-identical to XNNPACK's c8 kernels over the same weights
// (tests/integration/xnnpack_ops/qd8.rs compares them with a reference at every row count).
//
// Layout of a 16-column group (XNNPACK's qb4w packer with nr 16, kr 4): 16 float k-sums; per
// block of bl values of k, bl / 8 lines of 64 bytes (column j's 4 bytes at 4 * j; their low
// nibbles are 4 values of k, their high nibbles the next 4), then 16 bf16 scales; 16 float
// biases.

#include <assert.h>
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "xnnpack/common.h"
#include "xnnpack/microparams.h"
#include "qd8-f32-qb4w-gemm-avx512.h"

// Bytes of each row whose sign bits are flipped at a time: the stack buffer is MR times this.
// A row longer than this is taken a segment of whole blocks at a time, the accumulators kept in
// the output between segments (a float stored and loaded back is the same float).
#define XNNBLOB_SEGMENT_BYTES 2048

// How far ahead of the line of weights it reads a kernel asks for a line into L1: a prompt's
// weights come from L3 or memory, once per tile. 4096 bytes was the best of 1024, 2048, 4096 and
// 8192 for prompts of 1, 16 and 128 rows in ExecuTorch's runtime on an Emerald Rapids Xeon.
#ifndef XNNBLOB_PREFETCH_BYTES
#define XNNBLOB_PREFETCH_BYTES 4096
#endif
// Loops over a tile's rows are unrolled whole, so that each row's sums live in registers.
#define XNNBLOB_EACH_ROW _Pragma("GCC unroll 12")

// The sign bits of `bytes` bytes of a row flipped into `to` (a multiple of 32 bytes, which
// every block size is).
static XNN_INLINE void flip_signs(int8_t* to, const int8_t* from, size_t bytes) {
  const __m512i sign = _mm512_set1_epi8((char) 0x80);
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    _mm512_storeu_si512(to + i, _mm512_xor_si512(_mm512_loadu_si512(from + i), sign));
  }
  if (i < bytes) {
    const __mmask64 tail = _cvtu64_mask64((UINT64_C(1) << (bytes - i)) - 1);
    _mm512_mask_storeu_epi8(to + i, tail, _mm512_xor_si512(_mm512_maskz_loadu_epi8(tail, from + i), sign));
  }
}


// One segment of k (whole blocks, from k0) for every column of a call. `from` holds the rows'
// activations for the segment, their sign bits flipped unless FLIP (then flipped here, as they
// are broadcast). The accumulators start at the k-sums for the first segment and at the output
// for the others; the last segment finishes the output.
static XNN_INLINE void segment(
    const size_t MR, const size_t ACCS, const int FLIP, const int8_t* const* from, size_t k0,
    size_t k_len, size_t kc, size_t nc, const void* w, float* const* outs, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params* params,
    const struct xnn_qd8_quantization_params* const* quantization) {
  const size_t bl = params->scalar.blocksize;
  const size_t block_bytes = bl * 8 + 16 * sizeof(uint16_t);
  const size_t group_bytes = 16 * sizeof(float) + kc / bl * block_bytes + 16 * sizeof(float);
  const int first = k0 == 0;
  const int last = k0 + k_len == kc;
  const __m512i nibble = _mm512_set1_epi8((char) 0xF0);
  const __m512i sign = _mm512_set1_epi8((char) 0x80);

  const uint8_t* group = (const uint8_t*) w;
  for (size_t n0 = 0; n0 < nc; n0 += 16, group += group_bytes) {
    const size_t cols = nc - n0 < 16 ? nc - n0 : 16;
    const __mmask16 col_mask = _cvtu32_mask16((UINT32_C(1) << cols) - 1);
    float* out[12];
    __m512 acc[12];
    XNNBLOB_EACH_ROW
    for (size_t r = 0; r < MR; r++) {
      out[r] = (float*) ((uintptr_t) outs[r] + (n0 / 16) * cn_stride);
      if (first) {
        acc[r] = xnnblob_qb4w_start(group, quantization[r]);
      } else {
        acc[r] = _mm512_maskz_loadu_ps(col_mask, out[r]);
      }
    }
    const uint8_t* block = group + 16 * sizeof(float) + k0 / bl * block_bytes;
    for (size_t kb = 0; kb < k_len; kb += bl) {
      __m512i sums[12][2];
      XNNBLOB_EACH_ROW
      for (size_t r = 0; r < MR; r++) {
        for (size_t i = 0; i < ACCS; i++) {
          sums[r][i] = _mm512_setzero_si512();
        }
      }
      for (size_t k = kb; k < kb + bl; k += 8) {
        _mm_prefetch((const char*) block + XNNBLOB_PREFETCH_BYTES, _MM_HINT_T0);
        const __m512i packed = _mm512_loadu_si512(block);
        block += 64;
        // Each nibble in the top half of its byte: (value - 8) * 16 as a signed byte.
        const __m512i lo = _mm512_and_si512(_mm512_slli_epi32(packed, 4), nibble);
        const __m512i hi = _mm512_and_si512(packed, nibble);
        XNNBLOB_EACH_ROW
        for (size_t r = 0; r < MR; r++) {
          int32_t first4;
          int32_t next4;
          __builtin_memcpy(&first4, from[r] + k, sizeof(first4));
          __builtin_memcpy(&next4, from[r] + k + 4, sizeof(next4));
          __m512i va = _mm512_set1_epi32(first4);
          __m512i vb = _mm512_set1_epi32(next4);
          if (FLIP) {
            va = _mm512_xor_si512(va, sign);
            vb = _mm512_xor_si512(vb, sign);
          }
          sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], va, lo);
          sums[r][ACCS - 1] = _mm512_dpbusd_epi32(sums[r][ACCS - 1], vb, hi);
        }
      }
      const __m512 scale = xnnblob_bf16_scales(block);
      block += 16 * sizeof(uint16_t);
      XNNBLOB_EACH_ROW
      for (size_t r = 0; r < MR; r++) {
        __m512i sum = sums[r][0];
        for (size_t i = 1; i < ACCS; i++) {
          sum = _mm512_add_epi32(sum, sums[r][i]);
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
      }
    }
    if (last) {
      const __m512 bias = _mm512_loadu_ps((const float*) (group + group_bytes - 16 * sizeof(float)));
      XNNBLOB_EACH_ROW
      for (size_t r = 0; r < MR; r++) {
        acc[r] = xnnblob_qb4w_finish(acc[r], quantization[r], bias, params);
      }
    }
    // Rows past `mr` write where the last real row does, the same values.
    XNNBLOB_EACH_ROW
    for (size_t r = 0; r < MR; r++) {
      _mm512_mask_storeu_ps(out[r], col_mask, acc[r]);
    }
  }
}

// One call: `mr` rows (at most MR; the rows past `mr` repeat the last, as XNNPACK's kernels do)
// by `nc` columns. ACCS independent integer sums per row: two where too few rows would leave
// VPDPBUSD's latency exposed.
static XNN_INLINE void gemm(
    const size_t MR, const size_t ACCS, size_t mr, size_t nc, size_t kc, const int8_t* a,
    size_t a_stride, const void* w, float* c, size_t cm_stride, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params* params,
    const struct xnn_qd8_quantization_params* quantization_params) {
  assert(mr != 0 && mr <= MR);
  assert(nc != 0);
  const size_t bl = params->scalar.blocksize;
  assert(bl != 0 && bl % 32 == 0 && kc != 0 && kc % bl == 0);

  // Rows past `mr` take the last row's activations, parameters and output: they compute its
  // values again and store them where it does, whatever XNNPACK put past the batch.
  const int8_t* rows[12];
  float* outs[12];
  const struct xnn_qd8_quantization_params* quantization[12];
  XNNBLOB_EACH_ROW
  for (size_t r = 0; r < MR; r++) {
    const size_t real = r < mr ? r : mr - 1;
    rows[r] = (const int8_t*) ((uintptr_t) a + real * a_stride);
    outs[r] = (float*) ((uintptr_t) c + real * cm_stride);
    quantization[r] = &quantization_params[real];
  }
  if (bl > XNNBLOB_SEGMENT_BYTES) {
    // Blocks too long for the buffer: one pass, the sign bits flipped as they are broadcast.
    segment(MR, ACCS, 1, rows, 0, kc, kc, nc, w, outs, cn_stride, params, quantization);
    return;
  }
  const size_t per_segment = XNNBLOB_SEGMENT_BYTES / bl * bl;
  int8_t flipped[MR * XNNBLOB_SEGMENT_BYTES];
  const int8_t* from[12];
  XNNBLOB_EACH_ROW
  for (size_t r = 0; r < MR; r++) {
    from[r] = flipped + r * XNNBLOB_SEGMENT_BYTES;
  }
  for (size_t k0 = 0; k0 < kc; k0 += per_segment) {
    const size_t k_len = kc - k0 < per_segment ? kc - k0 : per_segment;
    XNNBLOB_EACH_ROW
    for (size_t r = 0; r < MR; r++) {
      flip_signs(flipped + r * XNNBLOB_SEGMENT_BYTES, rows[r] + k0, k_len);
    }
    // `from` holds the segment from its start: its k runs from 0.
    segment(MR, ACCS, 0, from, k0, k_len, kc, nc, w, outs, cn_stride, params, quantization);
  }
}

#define XNNBLOB_QD8_QB4W_GEMM(MR, ACCS)                                                           \
  void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_##MR##x16c4__avx512vnni(                          \
      size_t mr, size_t nc, size_t kc, const int8_t* restrict a, size_t a_stride,                 \
      const void* restrict w, float* restrict c, size_t cm_stride, size_t cn_stride,              \
      const struct xnn_f32_qb4w_minmax_params params[restrict XNN_MIN_ELEMENTS(1)],               \
      const struct xnn_qd8_quantization_params quantization_params[restrict XNN_MIN_ELEMENTS(1)]) \
      XNN_OOB_READS {                                                                             \
    gemm(MR, ACCS, mr, nc, kc, a, a_stride, w, c, cm_stride, cn_stride, params,                   \
         quantization_params);                                                                    \
  }

XNNBLOB_QD8_QB4W_GEMM(1, 2)
XNNBLOB_QD8_QB4W_GEMM(4, 2)
XNNBLOB_QD8_QB4W_GEMM(8, 1)
XNNBLOB_QD8_QB4W_GEMM(12, 1)
