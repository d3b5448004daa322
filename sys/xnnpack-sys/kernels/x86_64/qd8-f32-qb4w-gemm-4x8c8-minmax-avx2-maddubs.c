// xnnblob's own microkernel, not generated from XNNPACK's templates; registered by
// patches/0015-* in XNNPACK's qd8_f32_qb4w configuration for AVX2 without AVX512-VNNI.
//
// Up to four rows of dynamically quantized int8 activations against blockwise 4-bit weights with
// bf16 scales: the many-row GEMMs of a prefill. It reads the same packed weights as
// xnn_qd8_f32_qb4w_gemm_minmax_ukernel_3x8c8__avx2 and multiplies them as xnnblob's one-row
// kernel does (qd8-f32-qb4w-gemm-1x8c8-minmax-avx2-maddubs.c, whose comment gives the packed
// layout and the bounds): the weights, as unsigned nibbles u = w + 8, by the signed activations
// with vpmaddubsw, 32 products per instruction, and each row's 8 * sum(a) taken off once per
// block. Each 16 k of weights is unpacked once for the four rows.
//
// The 3-row kernel it replaces widens nibbles and activations to 16 bits for vpmaddwd and keeps
// 12 float and 12 integer accumulators, more than AVX2's 16 registers. This one keeps per row one
// float accumulator (in the column order hadd leaves, put back once per row) and two integer
// ones, and adds each 16 k's products in 16-bit lanes (at most 2 * 3840) before widening them.
// Four rows: a 16-token prefill is four tiles with none computed twice, and on the peer bench's
// prefill shapes four rows ran 1.1-1.3x faster than three, and faster than five or six, whose
// accumulators spill more.

#include <assert.h>

#include <immintrin.h>

#include "xnnpack/common.h"
#include "xnnpack/gemm.h"
#include "xnnpack/math.h"
#include "xnnpack/unaligned.h"
#include "qd8-f32-qb4w-gemm-avx2-maddubs.h"

// One row's 16 k against both column halves, into its two 32-bit accumulators (times 16: the
// packed scales are scale / 16).
#define ROW_16K(ROW)                                                                                       \
  do {                                                                                                     \
    const __m256i va_lo = _mm256_set1_epi64x((int64_t) unaligned_load_u64(a##ROW));                       \
    const __m256i va_hi = _mm256_set1_epi64x((int64_t) unaligned_load_u64(a##ROW + 8));                   \
    a##ROW += 16;                                                                                          \
    vacc##ROW##x0123 = _mm256_add_epi32(vacc##ROW##x0123, _mm256_madd_epi16(_mm256_add_epi16(              \
        _mm256_maddubs_epi16(vu0123_lo, va_lo), _mm256_maddubs_epi16(vu0123_hi, va_hi)), vsixteen));       \
    vacc##ROW##x4567 = _mm256_add_epi32(vacc##ROW##x4567, _mm256_madd_epi16(_mm256_add_epi16(              \
        _mm256_maddubs_epi16(vu4567_lo, va_lo), _mm256_maddubs_epi16(vu4567_hi, va_hi)), vsixteen));       \
  } while (0)

// Stores a row's 8 (or the last nc) results.
#define STORE_ROW(ROW)                                                                \
  do {                                                                                \
    __m128 vout0123 = _mm256_castps256_ps128(vout##ROW);                              \
    if (nc & 4) {                                                                     \
      _mm_storeu_ps(c##ROW, vout0123);                                                \
      vout0123 = _mm256_extractf128_ps(vout##ROW, 1);                                 \
      c##ROW += 4;                                                                    \
    }                                                                                 \
    if (nc & 2) {                                                                     \
      _mm_storel_pi((__m64*) c##ROW, vout0123);                                       \
      vout0123 = _mm_movehl_ps(vout0123, vout0123);                                   \
      c##ROW += 2;                                                                    \
    }                                                                                 \
    if (nc & 1) {                                                                     \
      _mm_store_ss(c##ROW, vout0123);                                                 \
    }                                                                                 \
  } while (0)

void xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x8c8__avx2_maddubs(
    size_t mr,
    size_t nc,
    size_t kc,
    const int8_t* restrict a,
    size_t a_stride,
    const void* restrict w,
    float* restrict c,
    size_t cm_stride,
    size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params params[restrict XNN_MIN_ELEMENTS(1)],
    const struct xnn_qd8_quantization_params quantization_params[restrict XNN_MIN_ELEMENTS(1)]) XNN_OOB_READS
{
  assert(mr != 0);
  assert(mr <= 4);
  assert(nc != 0);
  assert(kc != 0);
  assert(a != NULL);
  assert(w != NULL);
  assert(c != NULL);

  kc = round_up_po2(kc, 8 * sizeof(int8_t));
  const size_t bl = params->scalar.blocksize;
  assert(bl != 0);
  assert(bl % 32 == 0);
  assert(kc % bl == 0);
  const size_t blocks = kc / bl;

  // Rows past mr alias the last one, as in XNNPACK's kernels: computed again and stored again,
  // with the quantization parameters XNNPACK pads past the batch with the last row's.
  const int8_t* a0 = a;
  float* c0 = c;
  const int8_t* a1 = (const int8_t*) ((uintptr_t) a0 + a_stride);
  float* c1 = (float*) ((uintptr_t) c0 + cm_stride);
  if XNN_UNPREDICTABLE(mr < 2) {
    a1 = a0;
    c1 = c0;
  }
  const int8_t* a2 = (const int8_t*) ((uintptr_t) a1 + a_stride);
  float* c2 = (float*) ((uintptr_t) c1 + cm_stride);
  if XNN_UNPREDICTABLE(mr <= 2) {
    a2 = a1;
    c2 = c1;
  }
  const int8_t* a3 = (const int8_t*) ((uintptr_t) a2 + a_stride);
  float* c3 = (float*) ((uintptr_t) c2 + cm_stride);
  if XNN_UNPREDICTABLE(mr <= 3) {
    a3 = a2;
    c3 = c2;
  }

  int32_t block_sums[4][XNN_QB4W_MADDUBS_BLOCK_SUMS];
  const size_t summed = min(blocks, XNN_QB4W_MADDUBS_BLOCK_SUMS);
  for (size_t b = 0; b < summed; b++) {
    block_sums[0][b] = xnn_qb4w_maddubs_block_correction(a0 + b * bl, bl);
    block_sums[1][b] = xnn_qb4w_maddubs_block_correction(a1 + b * bl, bl);
    block_sums[2][b] = xnn_qb4w_maddubs_block_correction(a2 + b * bl, bl);
    block_sums[3][b] = xnn_qb4w_maddubs_block_correction(a3 + b * bl, bl);
  }

  const __m256i vflip = _mm256_set1_epi8((char) 0x88);
  const __m256i vnibble = _mm256_set1_epi8(0x0F);
  const __m256i vsixteen = _mm256_set1_epi16(16);
  // Between column order and hadd order (xnn_qb4w_maddubs_block_scales), either way.
  const __m256i vto_hadd_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  const __m256 vmin = _mm256_set1_ps(params->scalar.min);
  const __m256 vmax = _mm256_set1_ps(params->scalar.max);

  do {
    // The row terms in hadd order (the permutation is its own inverse).
    const __m256 vrow_terms = _mm256_permutevar8x32_ps(_mm256_loadu_ps((const float*) w), vto_hadd_order);
    w = (const float*) w + 8;
    __m256 vout0 = _mm256_mul_ps(vrow_terms, _mm256_set1_ps((float) quantization_params[0].zero_point));
    __m256 vout1 = _mm256_mul_ps(vrow_terms, _mm256_set1_ps((float) quantization_params[1].zero_point));
    __m256 vout2 = _mm256_mul_ps(vrow_terms, _mm256_set1_ps((float) quantization_params[2].zero_point));
    __m256 vout3 = _mm256_mul_ps(vrow_terms, _mm256_set1_ps((float) quantization_params[3].zero_point));

    for (size_t b = 0; b < blocks; b++) {
      __m256i vacc0x0123 = _mm256_setzero_si256();
      __m256i vacc0x4567 = _mm256_setzero_si256();
      __m256i vacc1x0123 = _mm256_setzero_si256();
      __m256i vacc1x4567 = _mm256_setzero_si256();
      __m256i vacc2x0123 = _mm256_setzero_si256();
      __m256i vacc2x4567 = _mm256_setzero_si256();
      __m256i vacc3x0123 = _mm256_setzero_si256();
      __m256i vacc3x4567 = _mm256_setzero_si256();
      size_t k = bl;
      do {
        const __m256i vu0123 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*) w), vflip);
        const __m256i vu4567 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*) ((const int8_t*) w + 32)), vflip);
        w = (const int8_t*) w + 64;
        const __m256i vu0123_lo = _mm256_and_si256(vu0123, vnibble);
        const __m256i vu0123_hi = _mm256_and_si256(_mm256_srli_epi16(vu0123, 4), vnibble);
        const __m256i vu4567_lo = _mm256_and_si256(vu4567, vnibble);
        const __m256i vu4567_hi = _mm256_and_si256(_mm256_srli_epi16(vu4567, 4), vnibble);
        ROW_16K(0);
        ROW_16K(1);
        ROW_16K(2);
        ROW_16K(3);
        k -= 16;
      } while (k != 0);
      const __m256 vscale = xnn_qb4w_maddubs_block_scales((const uint16_t*) w);
      w = (const uint16_t*) w + 8;
      const int32_t correction0 = b < summed ? block_sums[0][b] : xnn_qb4w_maddubs_block_correction(a0 - bl, bl);
      const int32_t correction1 = b < summed ? block_sums[1][b] : xnn_qb4w_maddubs_block_correction(a1 - bl, bl);
      const int32_t correction2 = b < summed ? block_sums[2][b] : xnn_qb4w_maddubs_block_correction(a2 - bl, bl);
      const int32_t correction3 = b < summed ? block_sums[3][b] : xnn_qb4w_maddubs_block_correction(a3 - bl, bl);
      vout0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_hadd_epi32(vacc0x0123, vacc0x4567),
                                                                  _mm256_set1_epi32(correction0))), vscale, vout0);
      vout1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_hadd_epi32(vacc1x0123, vacc1x4567),
                                                                  _mm256_set1_epi32(correction1))), vscale, vout1);
      vout2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_hadd_epi32(vacc2x0123, vacc2x4567),
                                                                  _mm256_set1_epi32(correction2))), vscale, vout2);
      vout3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_hadd_epi32(vacc3x0123, vacc3x4567),
                                                                  _mm256_set1_epi32(correction3))), vscale, vout3);
    }

    const __m256 vbias = _mm256_loadu_ps((const float*) w);
    w = (const float*) w + 8;
    vout0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(vout0, vto_hadd_order), _mm256_set1_ps(quantization_params[0].inv_scale), vbias);
    vout1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(vout1, vto_hadd_order), _mm256_set1_ps(quantization_params[1].inv_scale), vbias);
    vout2 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(vout2, vto_hadd_order), _mm256_set1_ps(quantization_params[2].inv_scale), vbias);
    vout3 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(vout3, vto_hadd_order), _mm256_set1_ps(quantization_params[3].inv_scale), vbias);
    vout0 = _mm256_min_ps(_mm256_max_ps(vout0, vmin), vmax);
    vout1 = _mm256_min_ps(_mm256_max_ps(vout1, vmin), vmax);
    vout2 = _mm256_min_ps(_mm256_max_ps(vout2, vmin), vmax);
    vout3 = _mm256_min_ps(_mm256_max_ps(vout3, vmin), vmax);

    // Each row pointer is back at its row's start for the next 8 columns.
    a0 = (const int8_t*) ((uintptr_t) a0 - kc);
    a1 = (const int8_t*) ((uintptr_t) a1 - kc);
    a2 = (const int8_t*) ((uintptr_t) a2 - kc);
    a3 = (const int8_t*) ((uintptr_t) a3 - kc);
    if XNN_LIKELY(nc >= 8) {
      _mm256_storeu_ps(c0, vout0);
      c0 = (float*) ((uintptr_t) c0 + cn_stride);
      _mm256_storeu_ps(c1, vout1);
      c1 = (float*) ((uintptr_t) c1 + cn_stride);
      _mm256_storeu_ps(c2, vout2);
      c2 = (float*) ((uintptr_t) c2 + cn_stride);
      _mm256_storeu_ps(c3, vout3);
      c3 = (float*) ((uintptr_t) c3 + cn_stride);
      nc -= 8;
    } else {
      STORE_ROW(0);
      STORE_ROW(1);
      STORE_ROW(2);
      STORE_ROW(3);
      nc = 0;
    }
  } while (nc != 0);
}
