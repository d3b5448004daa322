// xnnblob's own microkernel, not generated from XNNPACK's templates; registered by
// patches/0015-* in XNNPACK's qd8_f32_qb4w configuration for AVX2 without AVX512-VNNI.
//
// One row of dynamically quantized int8 activations against blockwise 4-bit weights with bf16
// scales, reading the same packed weights as xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2
// (nr 8, kr 8: per 8 columns, 8 float row terms, then per block the column groups and 8 bf16
// scales of scale / 16, then 8 float biases). That kernel widens every nibble and activation to
// 16 bits and multiplies them with vpmaddwd, 8 products per instruction; this one multiplies the
// weights, as unsigned nibbles, by the signed activations with vpmaddubsw, 32 products per
// instruction. A one-row GEMM is what an LLM runs for every decoded token.
//
// The packed nibble of weight w (zero point 8 removed) is w's low 4 bits; XOR 8 makes it the
// unsigned u = w + 8 in [0, 15], so sum(a * w) = sum(a * u) - 8 * sum(a). The 8 * sum(a) of each
// block depends on the row alone: it is computed once per call, not once per 8 columns.
// Bounds: |a| <= 128 and u <= 15, so a product is at most 1920 in magnitude, a pair (what
// vpmaddubsw adds) at most 3840 and never saturates, and the 16 products a 16-bit lane gathers
// over 64 k at most 30720: they fit.
//
// The block's sums are exact integers, as in the vpmaddwd kernel, times 16 to match the packed
// scale / 16; only the order of the float additions differs (one per column and block here, four
// partial lanes per column there).

#include <assert.h>

#include <immintrin.h>

#include "xnnpack/common.h"
#include "xnnpack/gemm.h"
#include "xnnpack/math.h"
#include "xnnpack/unaligned.h"
#include "qd8-f32-qb4w-gemm-avx2-maddubs.h"

// How far ahead of the 64 bytes being multiplied the weights are prefetched: far enough to cover
// DRAM's latency at the rate one core consumes them. On a Zen 3 core, 4 KiB was the shortest
// distance that streamed a decoded token's GEMMs as fast as any (patches/README, 0015).
#define XNN_QB4W_MADDUBS_PREFETCH_DISTANCE 4096

// The 16-bit lanes of one column half's products for 16 k: the low nibbles against the first 8
// activations, the high nibbles against the next 8.
static XNN_INLINE __m256i products16(const __m256i vpacked, __m256i va_lo, __m256i va_hi,
                                     __m256i vflip, __m256i vnibble) {
  const __m256i vu = _mm256_xor_si256(vpacked, vflip);
  const __m256i vu_lo = _mm256_and_si256(vu, vnibble);
  const __m256i vu_hi = _mm256_and_si256(_mm256_srli_epi16(vu, 4), vnibble);
  return _mm256_add_epi16(_mm256_maddubs_epi16(vu_lo, va_lo), _mm256_maddubs_epi16(vu_hi, va_hi));
}

void xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2_maddubs(
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
  assert(mr <= 1);
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
  int32_t block_sums[XNN_QB4W_MADDUBS_BLOCK_SUMS];
  const size_t summed = min(blocks, XNN_QB4W_MADDUBS_BLOCK_SUMS);
  for (size_t b = 0; b < summed; b++) {
    block_sums[b] = xnn_qb4w_maddubs_block_correction(a + b * bl, bl);
  }
  const int8_t* a0 = a;
  float* c0 = c;

  const __m256i vflip = _mm256_set1_epi8((char) 0x88);
  const __m256i vnibble = _mm256_set1_epi8(0x0F);
  // Widening pairs of 16-bit sums times 16: the packed scales are scale / 16.
  const __m256i vsixteen = _mm256_set1_epi16(16);
  // Between column order and hadd order (xnn_qb4w_maddubs_block_scales), either way.
  const __m256i vto_hadd_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  const __m256 vzero_point = _mm256_set1_ps((float) quantization_params[0].zero_point);
  const __m256 vinput_scale = _mm256_set1_ps(quantization_params[0].inv_scale);
  const __m256 vmin = _mm256_set1_ps(params->scalar.min);
  const __m256 vmax = _mm256_set1_ps(params->scalar.max);

  do {
    // The row terms in hadd order (the permutation is its own inverse).
    __m256 vout = _mm256_permutevar8x32_ps(
        _mm256_mul_ps(_mm256_loadu_ps((const float*) w), vzero_point), vto_hadd_order);
    w = (const float*) w + 8;

    for (size_t b = 0; b < blocks; b++) {
      __m256i vacc0123 = _mm256_setzero_si256();
      __m256i vacc4567 = _mm256_setzero_si256();
      size_t k = bl;
      do {
        // Up to 64 k in 16-bit lanes, then into 32-bit ones.
        __m256i vsum0123 = _mm256_setzero_si256();
        __m256i vsum4567 = _mm256_setzero_si256();
        // A 16-bit lane gathers 4 products a step (two vpmaddubsw pairs), each at most 15 * 128
        // in magnitude: 4 steps of 16 k fit, with 2047 to spare.
        _Static_assert(4 * 4 * 15 * 128 <= INT16_MAX, "the 16-bit sums of 4 steps could overflow");
        size_t steps = min(k / 16, 4);
        k -= steps * 16;
        do {
          const __m256i va_lo = _mm256_set1_epi64x((int64_t) unaligned_load_u64(a0));
          const __m256i va_hi = _mm256_set1_epi64x((int64_t) unaligned_load_u64(a0 + 8));
          a0 += 16;
          const __m256i vpacked0123 = _mm256_loadu_si256((const __m256i*) w);
          const __m256i vpacked4567 = _mm256_loadu_si256((const __m256i*) ((const int8_t*) w + 32));
          // One row uses each weight byte once and does little work per byte, so the kernel
          // streams the packed weights from memory; with the hardware prefetcher alone it waited
          // on them (patches/README, 0015). A prefetch never faults: lines past the end of the
          // weights cost a load slot, nothing more.
          _mm_prefetch((const char*) w + XNN_QB4W_MADDUBS_PREFETCH_DISTANCE, _MM_HINT_T0);
          w = (const int8_t*) w + 64;
          vsum0123 = _mm256_add_epi16(vsum0123, products16(vpacked0123, va_lo, va_hi, vflip, vnibble));
          vsum4567 = _mm256_add_epi16(vsum4567, products16(vpacked4567, va_lo, va_hi, vflip, vnibble));
        } while (--steps != 0);
        vacc0123 = _mm256_add_epi32(vacc0123, _mm256_madd_epi16(vsum0123, vsixteen));
        vacc4567 = _mm256_add_epi32(vacc4567, _mm256_madd_epi16(vsum4567, vsixteen));
      } while (k != 0);
      const int32_t correction = b < summed ? block_sums[b] : xnn_qb4w_maddubs_block_correction(a + b * bl, bl);
      const __m256i vacc = _mm256_sub_epi32(_mm256_hadd_epi32(vacc0123, vacc4567), _mm256_set1_epi32(correction));
      const __m256 vscale = xnn_qb4w_maddubs_block_scales((const uint16_t*) w);
      w = (const uint16_t*) w + 8;
      vout = _mm256_fmadd_ps(_mm256_cvtepi32_ps(vacc), vscale, vout);
    }

    const __m256 vbias = _mm256_loadu_ps((const float*) w);
    w = (const float*) w + 8;
    vout = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(vout, vto_hadd_order), vinput_scale, vbias);
    vout = _mm256_max_ps(vout, vmin);
    vout = _mm256_min_ps(vout, vmax);

    if XNN_LIKELY(nc >= 8) {
      _mm256_storeu_ps(c0, vout);
      c0 = (float*) ((uintptr_t) c0 + cn_stride);
      a0 = (const int8_t*) ((uintptr_t) a0 - kc);
      nc -= 8;
    } else {
      __m128 vout0123 = _mm256_castps256_ps128(vout);
      if (nc & 4) {
        _mm_storeu_ps(c0, vout0123);
        vout0123 = _mm256_extractf128_ps(vout, 1);
        c0 += 4;
      }
      if (nc & 2) {
        _mm_storel_pi((__m64*) c0, vout0123);
        vout0123 = _mm_movehl_ps(vout0123, vout0123);
        c0 += 2;
      }
      if (nc & 1) {
        _mm_store_ss(c0, vout0123);
      }
      nc = 0;
    }
  } while (nc != 0);
}
