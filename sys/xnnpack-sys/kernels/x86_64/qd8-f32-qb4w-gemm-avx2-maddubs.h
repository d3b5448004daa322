// xnnblob's own: what the vpmaddubsw qb4w kernels for AVX2 share, the one-row
// kernel (qd8-f32-qb4w-gemm-1x8c8-minmax-avx2-maddubs.c, whose header gives the packed layout
// and the bounds) and the four-row one (qd8-f32-qb4w-gemm-4x8c8-minmax-avx2-maddubs.c).
//
// Both multiply the weights, as unsigned nibbles u = w + 8, by the signed activations, so each
// block's sum is sum(a * u) - 8 * sum(a); the second term depends on the row alone and is
// computed once per call, here.

#pragma once

#include <stddef.h>
#include <stdint.h>

#include <immintrin.h>

#include "xnnpack/common.h"

// Blocks whose 16 * 8 * sum(a) a kernel keeps on its stack for each row (2 KiB): rows of up to
// 16384 activations in blocks of 32. Blocks past these are summed where they are used.
#define XNN_QB4W_MADDUBS_BLOCK_SUMS 512

// 16 * 8 * sum(a) over a block of bl activations (bl a multiple of 32): what a block's integer
// sum, times 16 as the packed scales are scale / 16, has too much.
static XNN_INLINE int32_t xnn_qb4w_maddubs_block_correction(const int8_t* a, size_t bl) {
  const __m256i vones = _mm256_set1_epi8(1);
  __m256i vsum = _mm256_setzero_si256();
  for (size_t k = 0; k < bl; k += 32) {
    // Pairs of activations (|.| <= 256) to 32-bit lanes.
    vsum = _mm256_add_epi32(vsum, _mm256_madd_epi16(_mm256_maddubs_epi16(vones, _mm256_loadu_si256((const __m256i*) (a + k))),
                                                    _mm256_set1_epi16(1)));
  }
  __m128i v = _mm_add_epi32(_mm256_castsi256_si128(vsum), _mm256_extracti128_si256(vsum, 1));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(v) * 128;
}

// A block's 8 bf16 scales as floats, in the column order that _mm256_hadd_epi32 of the two
// column halves' sums leaves: 0 1 4 5 | 2 3 6 7. The kernels accumulate in that order and put
// each row's results back in column order once, at its end.
static XNN_INLINE __m256 xnn_qb4w_maddubs_block_scales(const uint16_t* scales) {
  const __m128i vhadd_order = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i*) scales), vhadd_order)), 16));
}
