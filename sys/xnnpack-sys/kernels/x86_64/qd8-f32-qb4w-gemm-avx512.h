// xnnblob's own: what the AVX-512 qb4w kernels over XNNPACK's 16-column c4 packing share, the
// AVX512-VNNI ones (qd8-f32-qb4w-gemm-avx512vnni.c, whose header gives the packed layout) and
// the AMX-INT8 one (qd8-f32-qb4w-gemm-avx512amx.c): the float arithmetic around the integer
// sums, XNNPACK's, in its order, so that both are bit-identical to XNNPACK's kernels.

#pragma once

#include <immintrin.h>

#include "xnnpack/common.h"
#include "xnnpack/microparams.h"

// 16 bf16 scales as floats (a bf16 is the top half of a float).
static XNN_INLINE __m512 xnnblob_bf16_scales(const void* at) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*) at)), 16));
}

// A row's accumulator before the first block of k: the 16 columns' k-sums (at the start of
// their group) times the row's zero point + 128.
static XNN_INLINE __m512 xnnblob_qb4w_start(const void* group, const struct xnn_qd8_quantization_params* row) {
  return _mm512_mul_ps(_mm512_loadu_ps((const float*) group), _mm512_set1_ps((float) row->zero_point + 128));
}

// A row's output from its accumulator after the last block: times the row's inverse scale,
// plus the columns' biases, clamped.
static XNN_INLINE __m512 xnnblob_qb4w_finish(
    __m512 acc, const struct xnn_qd8_quantization_params* row, __m512 bias,
    const struct xnn_f32_qb4w_minmax_params* params) {
  acc = _mm512_mul_ps(acc, _mm512_set1_ps(row->inv_scale));
  acc = _mm512_add_ps(acc, bias);
  acc = _mm512_max_ps(acc, _mm512_set1_ps(params->scalar.min));
  return _mm512_min_ps(acc, _mm512_set1_ps(params->scalar.max));
}
