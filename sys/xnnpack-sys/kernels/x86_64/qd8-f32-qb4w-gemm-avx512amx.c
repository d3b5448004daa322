// xnnblob's qd8 x qb4w GEMM for x86-64 CPUs with AMX-INT8 (Intel Xeons from Sapphire Rapids on),
// as an XNNPACK dqgemm microkernel over XNNPACK's 16-column c4 packing of blockwise 4-bit weights
// (nr 16, kr 4, two nibble planes): up to 16 rows by 16 columns at a time.
//
// Registered by patches/0035 in XNNPACK's qd8_f32_qb4w configuration for AVX512-VNNI, as its
// widest (16-row) kernel where the CPU has AMX-INT8 and the kernel lets the process use the
// tiles. The 1-, 4-, 8- and 12-row AVX512-VNNI kernels (qd8-f32-qb4w-gemm-avx512vnni.c) keep
// the narrower tiles: a call here costs about the same whatever its rows, and below 13 rows
// the VNNI kernels are as fast or faster.
//
// Why: a prompt's rows are where the tiles pay. One TDPBUSD multiplies a 16-row by 32- or
// 64-byte tile of activations by a tile of weights of the same k for 16 columns, the work of 128
// (or 256) VPDPBUSDs. XNNPACK 4ea82e5 has AMX kernels for per-channel weights only (and builds
// none of them with GCC before 13), and ExecuTorch 1.5.1's backend runs blockwise weights on
// AVX512-VNNI. With blocks of 32 (an 8da4w export's) the tile stores of each block's sums, and
// the conversions after them, bound the kernel: 16 rows by 2816 by 1024 take about 0.6x the time
// of two 8-row AVX512-VNNI calls on an Emerald Rapids Xeon; blocks of 64 or more, about 0.4x.
//
// The arithmetic is that of the AVX512-VNNI kernels, so the outputs are bit-identical to them
// and to XNNPACK's c8 kernels: per block of k, the exact integer sum of (weight nibble - 8) * 16
// times (activation + 128) (a tile sums exactly, in any order), converted to float and
// multiplied by the block's scale into an accumulator that starts at the columns' k-sums times
// (zero point + 128); then the row's inverse scale, the bias and the clamp, in that order.
//
// Each call flips its rows' sign bits once (TDPBUSD, like VPDPBUSD, takes unsigned bytes times
// signed ones) into a tile per 32 or 64 values of k (a chunk). Per 16 columns, four blocks at a
// time: their packed lines are split into tile rows in a buffer on the stack (the c4 packing
// keeps a column's 4 values of k together, so a line's low nibbles are one tile row and its high
// nibbles the next), each block is multiplied into its own tile of sums, and the four tiles are
// stored, converted and scaled into 16 accumulators, one per row. The next four blocks' lines
// are split while these are multiplied: a tile loaded from lines just written waits for them.

#include <assert.h>
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xnnpack/common.h"
#include "xnnpack/microparams.h"
#include "qd8-f32-qb4w-gemm-avx512.h"

// The AVX512-VNNI kernels, for blocks longer than the activations buffer holds.
void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_12x16c4__avx512vnni(
    size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride, const void* w, float* c,
    size_t cm_stride, size_t cn_stride, const struct xnn_f32_qb4w_minmax_params* params,
    const struct xnn_qd8_quantization_params* quantization_params);
void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__avx512vnni(
    size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride, const void* w, float* c,
    size_t cm_stride, size_t cn_stride, const struct xnn_f32_qb4w_minmax_params* params,
    const struct xnn_qd8_quantization_params* quantization_params);

#define XNNBLOB_AMX_MR 16
// Bytes of each row whose sign bits are flipped at a time (whole blocks).
#define XNNBLOB_AMX_SEGMENT_BYTES 2048
#ifndef XNNBLOB_AMX_PREFETCH_BYTES
#define XNNBLOB_AMX_PREFETCH_BYTES 4096
#endif
#define XNNBLOB_EACH_AMX_ROW _Pragma("GCC unroll 16")
// A tile of weights: a chunk of at most 64 values of k, 16 bytes (4 values for 16 columns) each.
#define WEIGHT_TILE_BYTES 1024

// Tiles: four sums, one per block in flight, and two each of activations and weights, which
// the blocks take in turn. GCC's tile intrinsics paste their tile numbers into the instruction
// as written, so the numbers are macros, expanded by a wrapper before the intrinsic sees them.
#define SUMS0 0
#define SUMS1 1
#define SUMS2 2
#define SUMS3 3
#define ACTS0 4
#define ACTS1 5
#define WEIGHTS0 6
#define WEIGHTS1 7
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, from, stride) _tile_loadd(t, from, stride)
#define TILE_STORE(t, to, stride) _tile_stored(t, to, stride)
#define TILE_DPBUSD(sums, acts, weights) _tile_dpbusd(sums, acts, weights)

// AMX's tile configuration (palette 1), as LDTILECFG reads it.
struct tile_config {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

// `bytes` bytes of a row (whole chunks) with their sign bits flipped, into the row's place in
// each chunk's tile of activations (`chunk` bytes a row, 16 rows a tile).
static XNN_INLINE void flip_into_tiles(uint8_t* tiles, size_t row, const int8_t* from, size_t bytes, size_t chunk) {
  const __m512i sign = _mm512_set1_epi8((char) 0x80);
  uint8_t* to = tiles + row * chunk;
  if (chunk == 64) {
    for (size_t i = 0; i < bytes; i += 64, to += 16 * 64) {
      _mm512_store_si512(to, _mm512_xor_si512(_mm512_loadu_si512(from + i), sign));
    }
  } else {
    for (size_t i = 0; i < bytes; i += 32, to += 16 * 32) {
      _mm256_store_si256((__m256i*) to, _mm256_xor_si256(_mm256_loadu_si256((const __m256i*) (from + i)), _mm512_castsi512_si256(sign)));
    }
  }
}


// `lines` packed lines of 64 bytes (8 values of k for 16 columns) as 2 * `lines` tile rows:
// each nibble in the top half of its byte, (value - 8) * 16 as a signed byte.
static XNN_INLINE void split_lines(uint8_t* to, const uint8_t* from, size_t lines) {
  const __m512i nibble = _mm512_set1_epi8((char) 0xF0);
  for (size_t i = 0; i < lines; i++) {
    _mm_prefetch((const char*) from + 64 * i + XNNBLOB_AMX_PREFETCH_BYTES, _MM_HINT_T0);
    const __m512i packed = _mm512_loadu_si512(from + 64 * i);
    _mm512_store_si512(to + 128 * i, _mm512_and_si512(_mm512_slli_epi32(packed, 4), nibble));
    _mm512_store_si512(to + 128 * i + 64, _mm512_and_si512(packed, nibble));
  }
}

// A chunk of k of four blocks, from `at` (the first block's chunk), as four tiles'
// worth of rows.
static XNN_INLINE void split_unit(uint8_t* to, const uint8_t* at, size_t block_bytes, size_t chunk) {
  for (size_t i = 0; i < 4; i++) {
    split_lines(to + i * WEIGHT_TILE_BYTES, at + i * block_bytes, chunk / 8);
  }
}

// The sums of one block's multiply, stored, scaled into the accumulators.
static XNN_INLINE void scale_into(__m512 acc[XNNBLOB_AMX_MR], const int32_t* sums, const void* scales) {
  const __m512 scale = xnnblob_bf16_scales(scales);
  XNNBLOB_EACH_AMX_ROW
  for (size_t r = 0; r < XNNBLOB_AMX_MR; r++) {
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * r)), scale, acc[r]);
  }
}

// One segment of k (whole blocks, from k0) for every column of a call; `acts` holds the rows'
// activations for the segment, sign bits flipped, a tile per chunk of k. The tiles
// are configured for the call's rows and a chunk of `chunk` values of k (32 or 64) per multiply.
static XNN_INLINE void segment(
    size_t mr, const uint8_t* acts, size_t chunk, size_t k0, size_t k_len, size_t kc, size_t nc,
    const void* w, float* const* outs, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params* params,
    const struct xnn_qd8_quantization_params* const* quantization) {
  const size_t bl = params->scalar.blocksize;
  const size_t block_bytes = bl * 8 + 16 * sizeof(uint16_t);
  const size_t group_bytes = 16 * sizeof(float) + kc / bl * block_bytes + 16 * sizeof(float);
  const size_t tile_bytes = 16 * chunk;
  const size_t blocks = k_len / bl;
  const int first = k0 == 0;
  const int last = k0 + k_len == kc;
  // Rows past `mr` of the stored sums are never written by the tiles: zeros, scaled and dropped.
  XNN_ALIGN(64) int32_t sums[4 * XNNBLOB_AMX_MR * 16] = {0};
  // Two units' weights as tile rows (16 bytes per value of k): one multiplied, one split.
  XNN_ALIGN(64) uint8_t weights[2 * 4 * WEIGHT_TILE_BYTES];

  const uint8_t* group = (const uint8_t*) w;
  for (size_t n0 = 0; n0 < nc; n0 += 16, group += group_bytes) {
    const size_t cols = nc - n0 < 16 ? nc - n0 : 16;
    const __mmask16 col_mask = _cvtu32_mask16((UINT32_C(1) << cols) - 1);
    float* out[XNNBLOB_AMX_MR];
    __m512 acc[XNNBLOB_AMX_MR];
    XNNBLOB_EACH_AMX_ROW
    for (size_t r = 0; r < XNNBLOB_AMX_MR; r++) {
      out[r] = (float*) ((uintptr_t) outs[r] + (n0 / 16) * cn_stride);
      if (first) {
        acc[r] = xnnblob_qb4w_start(group, quantization[r]);
      } else {
        acc[r] = _mm512_maskz_loadu_ps(col_mask, out[r]);
      }
    }
    const uint8_t* block = group + 16 * sizeof(float) + k0 / bl * block_bytes;
    // Four blocks at a time, each summed on its own tile, a chunk of k at a time (a unit); a
    // unit's weights are split while the unit before it is multiplied.
    const size_t chunks = bl / chunk;
    const size_t units = blocks / 4 * chunks;
    if (units != 0) {
      split_unit(weights, block, block_bytes, chunk);
    }
    for (size_t u = 0; u < units; u++) {
      const size_t c = u % chunks;
      const uint8_t* first_block = block + (u / chunks) * 4 * block_bytes;
      // The unit's first tile of activations; a block's tiles are `chunks` tiles apart.
      const uint8_t* a0 = acts + ((u / chunks) * 4 * chunks + c) * tile_bytes;
      const uint8_t* w = weights + (u & 1) * 4 * WEIGHT_TILE_BYTES;
      if (c == 0) {
        TILE_ZERO(SUMS0);
        TILE_ZERO(SUMS1);
        TILE_ZERO(SUMS2);
        TILE_ZERO(SUMS3);
      }
      TILE_LOAD(WEIGHTS0, w, 64);
      TILE_LOAD(ACTS0, a0, chunk);
      TILE_DPBUSD(SUMS0, ACTS0, WEIGHTS0);
      TILE_LOAD(WEIGHTS1, w + WEIGHT_TILE_BYTES, 64);
      TILE_LOAD(ACTS1, a0 + chunks * tile_bytes, chunk);
      TILE_DPBUSD(SUMS1, ACTS1, WEIGHTS1);
      TILE_LOAD(WEIGHTS0, w + 2 * WEIGHT_TILE_BYTES, 64);
      TILE_LOAD(ACTS0, a0 + 2 * chunks * tile_bytes, chunk);
      TILE_DPBUSD(SUMS2, ACTS0, WEIGHTS0);
      TILE_LOAD(WEIGHTS1, w + 3 * WEIGHT_TILE_BYTES, 64);
      TILE_LOAD(ACTS1, a0 + 3 * chunks * tile_bytes, chunk);
      TILE_DPBUSD(SUMS3, ACTS1, WEIGHTS1);
      if (u + 1 < units) {
        const size_t next = u + 1;
        split_unit(weights + (next & 1) * 4 * WEIGHT_TILE_BYTES,
                   block + (next / chunks) * 4 * block_bytes + (next % chunks) * chunk * 8, block_bytes, chunk);
      }
      if (c + 1 == chunks) {
        TILE_STORE(SUMS0, sums, 64);
        TILE_STORE(SUMS1, sums + 256, 64);
        TILE_STORE(SUMS2, sums + 512, 64);
        TILE_STORE(SUMS3, sums + 768, 64);
        for (size_t i = 0; i < 4; i++) {
          scale_into(acc, sums + 256 * i, first_block + i * block_bytes + bl * 8);
        }
      }
    }
    block += blocks / 4 * 4 * block_bytes;
    size_t b = blocks / 4 * 4;
    for (; b < blocks; b++) {
      TILE_ZERO(SUMS0);
      for (size_t k = 0; k < bl; k += chunk) {
        split_lines(weights, block + k * 8, chunk / 8);
        TILE_LOAD(WEIGHTS0, weights, 64);
        TILE_LOAD(ACTS0, acts + (b * bl + k) / chunk * tile_bytes, chunk);
        TILE_DPBUSD(SUMS0, ACTS0, WEIGHTS0);
      }
      TILE_STORE(SUMS0, sums, 64);
      scale_into(acc, sums, block + bl * 8);
      block += block_bytes;
    }
    if (last) {
      const __m512 bias = _mm512_loadu_ps((const float*) (group + group_bytes - 16 * sizeof(float)));
      XNNBLOB_EACH_AMX_ROW
      for (size_t r = 0; r < XNNBLOB_AMX_MR; r++) {
        acc[r] = xnnblob_qb4w_finish(acc[r], quantization[r], bias, params);
      }
    }
    // Only the call's rows: the sums of the others are not theirs.
    XNNBLOB_EACH_AMX_ROW
    for (size_t r = 0; r < XNNBLOB_AMX_MR; r++) {
      if (r < mr) {
        _mm512_mask_storeu_ps(out[r], col_mask, acc[r]);
      }
    }
  }
}

void xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_16x16c4__avx512amx(
    size_t mr, size_t nc, size_t kc, const int8_t* restrict a, size_t a_stride,
    const void* restrict w, float* restrict c, size_t cm_stride, size_t cn_stride,
    const struct xnn_f32_qb4w_minmax_params params[restrict XNN_MIN_ELEMENTS(1)],
    const struct xnn_qd8_quantization_params quantization_params[restrict XNN_MIN_ELEMENTS(1)])
    XNN_OOB_READS {
  assert(mr != 0 && mr <= XNNBLOB_AMX_MR);
  assert(nc != 0);
  const size_t bl = params->scalar.blocksize;
  assert(bl != 0 && bl % 32 == 0 && kc != 0 && kc % bl == 0);
  if (bl > XNNBLOB_AMX_SEGMENT_BYTES) {
    // Blocks too long for the buffer (no exported LLM has them): the AVX512-VNNI kernels.
    const size_t first = mr < 12 ? mr : 12;
    xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_12x16c4__avx512vnni(
        first, nc, kc, a, a_stride, w, c, cm_stride, cn_stride, params, quantization_params);
    for (size_t r = first; r < mr; r += 4) {
      xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__avx512vnni(
          mr - r < 4 ? mr - r : 4, nc, kc, (const int8_t*) ((uintptr_t) a + r * a_stride), a_stride,
          w, (float*) ((uintptr_t) c + r * cm_stride), cm_stride, cn_stride, params,
          &quantization_params[r]);
    }
    return;
  }

  // Rows past `mr` take the last row's parameters and output, so that every pointer the
  // unrolled loops form is one of the call's; their values are never stored.
  float* outs[XNNBLOB_AMX_MR];
  const struct xnn_qd8_quantization_params* quantization[XNNBLOB_AMX_MR];
  XNNBLOB_EACH_AMX_ROW
  for (size_t r = 0; r < XNNBLOB_AMX_MR; r++) {
    const size_t real = r < mr ? r : mr - 1;
    outs[r] = (float*) ((uintptr_t) c + real * cm_stride);
    quantization[r] = &quantization_params[real];
  }

  const size_t chunk = bl % 64 == 0 ? 64 : 32;
  struct tile_config config;
  memset(&config, 0, sizeof(config));
  config.palette = 1;
  config.rows[SUMS0] = config.rows[SUMS1] = config.rows[SUMS2] = config.rows[SUMS3] = (uint8_t) mr;
  config.bytes_per_row[SUMS0] = config.bytes_per_row[SUMS1] = 64;
  config.bytes_per_row[SUMS2] = config.bytes_per_row[SUMS3] = 64;
  config.rows[ACTS0] = config.rows[ACTS1] = (uint8_t) mr;
  config.bytes_per_row[ACTS0] = config.bytes_per_row[ACTS1] = (uint16_t) chunk;
  config.rows[WEIGHTS0] = config.rows[WEIGHTS1] = (uint8_t) (chunk / 4);
  config.bytes_per_row[WEIGHTS0] = config.bytes_per_row[WEIGHTS1] = 64;
  _tile_loadconfig(&config);

  const size_t per_segment = XNNBLOB_AMX_SEGMENT_BYTES / bl * bl;
  XNN_ALIGN(64) uint8_t acts[XNNBLOB_AMX_MR * XNNBLOB_AMX_SEGMENT_BYTES];
  for (size_t k0 = 0; k0 < kc; k0 += per_segment) {
    const size_t k_len = kc - k0 < per_segment ? kc - k0 : per_segment;
    for (size_t r = 0; r < mr; r++) {
      flip_into_tiles(acts, r, (const int8_t*) ((uintptr_t) a + r * a_stride) + k0, k_len, chunk);
    }
    segment(mr, acts, chunk, k0, k_len, kc, nc, w, outs, cn_stride, params, quantization);
  }
  // Back to the initial state, so that the tiles' state is not saved and restored with the
  // thread's until a kernel configures them again.
  _tile_release();
}
