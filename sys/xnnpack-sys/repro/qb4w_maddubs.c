// xnnblob's AVX2 qb4w kernels (kernels/x86_64: one row, and up to four; patches/0015-*) against the
// kernels they replace, xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2 and _3x8c8__avx2, called
// directly on the same packed weights (random bytes in the packed layout: 8 float row terms per
// 8 columns, then per block the nibble groups and 8 bf16 scales, then 8 float biases):
//  1. the outputs of each pair, against a double-precision reference computed from the packed
//     bytes (they may differ from it, and from each other, only by float rounding), on random
//     weights and activations and on the extreme ones (every activation -128, three weights in
//     four 7, the rest -8), for blocks of 32 to 256, rows of up to 1024 blocks (past the 512
//     whose sums the kernels keep), every column remainder, and 1 to 4 rows (a call of fewer rows
//     than its kernel's aliases the last, with its quantization parameters, as XNNPACK pads
//     them);
//  2. the time per call, single-threaded, on the GEMMs of the peer bench's exports: one row (a
//     decoded token) of the d=1024 decoder (q/k/v/o 1024x1024, FFN 1024x2816 and 2816x1024, the
//     32000-column output) and the 1B-class one (2048x2048, 2048x8192, 8192x2048), and a
//     16-token prefill of the d=1024 decoder's shapes (five 3-row calls and a 1-row one of
//     XNNPACK's kernel, four 4-row calls of xnnblob's, as XNNPACK tiles it for each);
//  3. the time of one decoded token's one-row GEMMs, each on weights of its own, so that they
//     stream from memory as in a decode (run it against builds with and without the one-row kernel's
//     prefetch, passing BUILD_DIR, to see what the prefetch gives).
//
// Built and run by run.sh (x86-64 only). Exits 1 when an output differs by more than float
// rounding, 3 when this CPU has no AVX2.

// clock_gettime under -std=c11.
#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xnnpack.h>

#include "xnnpack/gemm.h"
#include "xnnpack/hardware-config.h"
#include "xnnpack/microparams.h"

static uint32_t rng_state = 7;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}

// Packed weights for nc columns (rounded up to 8), kc = blocks * bl.
static uint8_t* make_packed(size_t nc, size_t kc, size_t bl, int extreme, size_t* size_out) {
  const size_t blocks = kc / bl;
  const size_t group = 8 * sizeof(float) + blocks * (bl / 16 * 64 + 8 * sizeof(uint16_t)) + 8 * sizeof(float);
  const size_t groups = (nc + 7) / 8;
  uint8_t* packed = aligned_alloc(64, groups * group + 64);
  for (size_t g = 0; g < groups; g++) {
    uint8_t* p = packed + g * group;
    for (int i = 0; i < 8; i++) ((float*) p)[i] = (float) ((int) (next_u32() % 2001) - 1000) / 100.0f;
    p += 8 * sizeof(float);
    for (size_t b = 0; b < blocks; b++) {
      for (size_t i = 0; i < bl / 16 * 64; i++) {
        // A packed nibble is the weight's low 4 bits: 0x88 is -8 twice, 0x77 is 7 twice. Against
        // activations of -128, mostly 7s give the largest sums the new kernel's 16-bit lanes hold
        // (it multiplies u = w + 8 = 15).
        p[i] = extreme ? (next_u32() % 4 != 0 ? 0x77 : 0x88) : (uint8_t) next_u32();
      }
      p += bl / 16 * 64;
      for (int i = 0; i < 8; i++) {
        const float scale = (float) (next_u32() % 1000 + 1) / 65536.0f;
        uint32_t bits;
        memcpy(&bits, &scale, sizeof(bits));
        ((uint16_t*) p)[i] = (uint16_t) (bits >> 16);
      }
      p += 8 * sizeof(uint16_t);
    }
    for (int i = 0; i < 8; i++) ((float*) p)[i] = (float) ((int) (next_u32() % 2001) - 1000) / 100.0f;
  }
  *size_out = groups * group;
  return packed;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

// Column `n`'s output computed in double from the packed bytes, and the sum of the magnitudes
// of its terms (what float rounding is relative to).
static double reference(const uint8_t* packed, size_t n, size_t kc, size_t bl, const int8_t* a,
                        const struct xnn_qd8_quantization_params* qp, double* magnitude) {
  const size_t blocks = kc / bl;
  const size_t group = 8 * sizeof(float) + blocks * (bl / 16 * 64 + 8 * sizeof(uint16_t)) + 8 * sizeof(float);
  const uint8_t* p = packed + (n / 8) * group;
  const size_t c = n % 8;
  float init, bias;
  memcpy(&init, p + c * sizeof(float), sizeof(init));
  p += 8 * sizeof(float);
  double sum = (double) init * qp->zero_point;
  *magnitude = fabs(sum);
  for (size_t b = 0; b < blocks; b++) {
    int64_t acc = 0;
    for (size_t step = 0; step < bl / 16; step++) {
      for (size_t j = 0; j < 8; j++) {
        const uint8_t byte = p[step * 64 + c * 8 + j];
        const int w_lo = ((byte & 0xF) ^ 8) - 8, w_hi = ((byte >> 4) ^ 8) - 8;
        acc += (int64_t) a[b * bl + step * 16 + j] * w_lo + (int64_t) a[b * bl + step * 16 + 8 + j] * w_hi;
      }
    }
    p += bl / 16 * 64;
    uint16_t scale_bits;
    memcpy(&scale_bits, p + c * sizeof(uint16_t), sizeof(scale_bits));
    const uint32_t bits = (uint32_t) scale_bits << 16;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    p += 8 * sizeof(uint16_t);
    // The packed scale is scale / 16: the kernels multiply by weights times 16.
    sum += 16.0 * (double) acc * scale;
    *magnitude += fabs(16.0 * (double) acc * scale);
  }
  memcpy(&bias, p + c * sizeof(float), sizeof(bias));
  *magnitude = *magnitude * qp->inv_scale + fabs(bias);
  return sum * qp->inv_scale + bias;
}

typedef void (*qb4w_gemm_fn)(size_t mr, size_t nc, size_t kc, const int8_t* a, size_t a_stride,
                             const void* w, float* c, size_t cm_stride, size_t cn_stride,
                             const struct xnn_f32_qb4w_minmax_params* params,
                             const struct xnn_qd8_quantization_params* quantization_params);

// XNNPACK's kernel and xnnblob's that takes its place, with the rows each takes per call.
struct pair {
  const char* name;
  size_t xnnpack_mr, maddubs_mr;
  qb4w_gemm_fn xnnpack, maddubs;
};

static const struct pair pairs[] = {
  {"1x8c8", 1, 1, xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2, xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x8c8__avx2_maddubs},
  {"3x8c8 and 4x8c8", 3, 4, xnn_qd8_f32_qb4w_gemm_minmax_ukernel_3x8c8__avx2, xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x8c8__avx2_maddubs},
};

#define MAX_ROWS 4
// Padding past the rows, as XNNPACK gives its quantization parameters.
#define PADDED_ROWS (MAX_ROWS + 2)

// Runs one kernel over `rows` rows of activations (a row every kc bytes) the way XNNPACK tiles
// a GEMM: calls of up to mr rows, each reading its quantization parameters from its first row.
static void run_rows(qb4w_gemm_fn fn, size_t mr, size_t rows, size_t nc, size_t kc, const int8_t* a,
                     const void* packed, float* out, const struct xnn_f32_qb4w_minmax_params* params,
                     const struct xnn_qd8_quantization_params* qp) {
  for (size_t row = 0; row < rows; row += mr) {
    const size_t tile = rows - row < mr ? rows - row : mr;
    fn(tile, nc, kc, a + row * kc, kc, packed, out + row * nc, nc * sizeof(float), 8 * sizeof(float), params, qp + row);
  }
}

static int check_outputs(void) {
  struct xnn_qd8_quantization_params qp[PADDED_ROWS];
  int wrong = 0;
  size_t cases = 0;
  for (size_t bl = 32; bl <= 256; bl *= 2) {
    for (size_t blocks = 1; blocks <= 1024; blocks = blocks < 4 ? blocks + 1 : blocks * 4) {
      for (size_t nc = 1; nc <= 33; nc += (nc < 17 ? 1 : 8)) {
        for (int extreme = 0; extreme < 2; extreme++) {
          const size_t kc = bl * blocks;
          size_t size;
          uint8_t* packed = make_packed(nc, kc, bl, extreme, &size);
          int8_t* a = malloc(MAX_ROWS * kc + 16);
          for (size_t i = 0; i < MAX_ROWS * kc + 16; i++) a[i] = extreme ? -128 : (int8_t) next_u32();
          struct xnn_f32_qb4w_minmax_params params;
          memset(&params, 0, sizeof(params));
          params.scalar.min = -INFINITY;
          params.scalar.max = INFINITY;
          params.scalar.blocksize = bl;
          for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
            for (size_t rows = 1; rows <= pairs[p].maddubs_mr; rows++) {
              for (size_t r = 0; r < rows; r++) {
                qp[r].zero_point = (int32_t) (next_u32() % 256) - 128;
                qp[r].inv_scale = 0.01f * (float) (r + 1);
              }
              for (size_t r = rows; r < PADDED_ROWS; r++) qp[r] = qp[rows - 1];
              // Each row's outputs and a guard past its nc (the stride is nc).
              float old_out[MAX_ROWS * 40], new_out[MAX_ROWS * 40];
              for (int i = 0; i < MAX_ROWS * 40; i++) old_out[i] = new_out[i] = 12345.0f;
              run_rows(pairs[p].xnnpack, pairs[p].xnnpack_mr, rows, nc, kc, a, packed, old_out, &params, qp);
              run_rows(pairs[p].maddubs, pairs[p].maddubs_mr, rows, nc, kc, a, packed, new_out, &params, qp);
              for (size_t i = 0; i < MAX_ROWS * 40; i++) {
                const size_t r = i / nc, n = i % nc;
                int bad = 0;
                double expected = 12345.0;
                if (r < rows) {
                  double magnitude;
                  expected = reference(packed, n, kc, bl, a + r * kc, &qp[r], &magnitude);
                  // A float rounding per block and a few more, each relative to the terms' size.
                  const double tolerance = (double) (blocks + 4) * 1.2e-7 * magnitude + 1e-30;
                  bad = !(fabs(new_out[i] - expected) <= tolerance) || !(fabs(old_out[i] - expected) <= tolerance);
                } else {
                  bad = new_out[i] != 12345.0f;
                }
                if (bad && wrong++ < 10) {
                  printf("WRONG %s rows=%zu bl=%zu kc=%zu nc=%zu extreme=%d row %zu column %zu: maddubs %.9g, XNNPACK's %.9g, reference %.9g\n",
                         pairs[p].name, rows, bl, kc, nc, extreme, r, n, new_out[i], old_out[i], expected);
                }
              }
              cases++;
            }
          }
          free(packed);
          free(a);
        }
      }
    }
  }
  printf("outputs: %zu cases, %d wrong\n", cases, wrong);
  return wrong;
}

// The median of n times (sorts them in place; n is odd).
static double median(double* times, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (times[j] < times[i]) { const double t = times[i]; times[i] = times[j]; times[j] = t; }
  return times[n / 2];
}

// The median of 5 rounds of `reps` runs of one kernel over `rows` rows, per run.
static double time_rows(qb4w_gemm_fn fn, size_t mr, size_t rows, size_t nc, size_t kc, const int8_t* a,
                        const void* packed, float* out, const struct xnn_f32_qb4w_minmax_params* params,
                        const struct xnn_qd8_quantization_params* qp, size_t reps) {
  double rounds[5];
  for (int r = 0; r < 5; r++) {
    const double start = now();
    for (size_t i = 0; i < reps; i++) run_rows(fn, mr, rows, nc, kc, a, packed, out, params, qp);
    rounds[r] = (now() - start) / (double) reps;
  }
  return median(rounds, 5);
}

static void time_shapes(const struct pair* pair, size_t rows, const size_t (*shapes)[2], size_t count) {
  printf("time per %zu-row GEMM, %s kernels, median of 5 rounds (blocks of 32):\n", rows, pair->name);
  struct xnn_qd8_quantization_params qp[16 + PADDED_ROWS];
  for (size_t r = 0; r < 16 + PADDED_ROWS; r++) {
    qp[r].zero_point = 3;
    qp[r].inv_scale = 0.01f;
  }
  for (size_t s = 0; s < count; s++) {
    const size_t kc = shapes[s][0], nc = shapes[s][1];
    size_t size;
    uint8_t* packed = make_packed(nc, kc, 32, 0, &size);
    int8_t* a = malloc(rows * kc + 16);
    for (size_t i = 0; i < rows * kc + 16; i++) a[i] = (int8_t) next_u32();
    float* out = malloc(rows * nc * sizeof(float));
    struct xnn_f32_qb4w_minmax_params params;
    memset(&params, 0, sizeof(params));
    params.scalar.min = -INFINITY;
    params.scalar.max = INFINITY;
    params.scalar.blocksize = 32;
    const size_t reps = 1 + (size_t) (2e8 / (double) (size * rows));
    const double old_time = time_rows(pair->xnnpack, pair->xnnpack_mr, rows, nc, kc, a, packed, out, &params, qp, reps);
    const double new_time = time_rows(pair->maddubs, pair->maddubs_mr, rows, nc, kc, a, packed, out, &params, qp, reps);
    printf("  kc=%-5zu nc=%-5zu %6.2f MiB packed: XNNPACK's %9.1f us, maddubs %9.1f us (%.2fx)\n", kc, nc,
           (double) size / 1048576.0, 1e6 * old_time, 1e6 * new_time, old_time / new_time);
    free(packed);
    free(a);
    free(out);
  }
}

// One decoded token of the d=1024 decoder as it reaches memory: its 85 one-row GEMMs (12
// layers of q, k, v, o, two 1024x2816 and one 2816x1024, then the 32000-column output), each on
// weights of its own, 101.5 MiB in all, so every call streams its weights from memory as a decode
// does (the shapes above reuse one matrix, which stays in cache when it is small). The median of
// 15 rounds, the two kernels alternating.
static void time_streamed_token(void) {
  const size_t layer[][2] = {{1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 1024}, {1024, 2816}, {1024, 2816}, {2816, 1024}};
  enum { LAYERS = 12, PER_LAYER = 7, GEMMS = LAYERS * PER_LAYER + 1 };
  size_t kc[GEMMS], nc[GEMMS], total = 0;
  uint8_t* packed[GEMMS];
  for (size_t i = 0; i < GEMMS; i++) {
    kc[i] = i + 1 < GEMMS ? layer[i % PER_LAYER][0] : 1024;
    nc[i] = i + 1 < GEMMS ? layer[i % PER_LAYER][1] : 32000;
    size_t size;
    packed[i] = make_packed(nc[i], kc[i], 32, 0, &size);
    total += size;
  }
  int8_t* a = malloc(2816 + 16);
  for (size_t i = 0; i < 2816 + 16; i++) a[i] = (int8_t) next_u32();
  float* out = malloc(32000 * sizeof(float));
  struct xnn_qd8_quantization_params qp[PADDED_ROWS];
  for (size_t r = 0; r < PADDED_ROWS; r++) {
    qp[r].zero_point = 3;
    qp[r].inv_scale = 0.01f;
  }
  struct xnn_f32_qb4w_minmax_params params;
  memset(&params, 0, sizeof(params));
  params.scalar.min = -INFINITY;
  params.scalar.max = INFINITY;
  params.scalar.blocksize = 32;
  enum { ROUNDS = 15 };
  double times[2][ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    for (int k = 0; k < 2; k++) {
      const qb4w_gemm_fn fn = k == 0 ? pairs[0].xnnpack : pairs[0].maddubs;
      const double start = now();
      for (size_t i = 0; i < GEMMS; i++) run_rows(fn, 1, 1, nc[i], kc[i], a, packed[i], out, &params, qp);
      times[k][r] = now() - start;
    }
  }
  const double old_time = median(times[0], ROUNDS), new_time = median(times[1], ROUNDS);
  printf("one decoded token's GEMMs on their own weights (%zu calls, %.1f MiB), median of %d rounds:\n"
         "  XNNPACK's 1x8c8 %.2f ms (%.1f GB/s), maddubs %.2f ms (%.1f GB/s) (%.2fx)\n",
         (size_t) GEMMS, (double) total / 1048576.0, ROUNDS, 1e3 * old_time, (double) total / old_time / 1e9,
         1e3 * new_time, (double) total / new_time / 1e9, old_time / new_time);
  for (size_t i = 0; i < GEMMS; i++) free(packed[i]);
  free(a);
  free(out);
}

int main(void) {
  if (xnn_initialize(NULL) != xnn_status_success) return 2;
  if (!xnn_init_hardware_config()->use_x86_avx2) {
    printf("this CPU has no AVX2\n");
    return 3;
  }
  const int wrong = check_outputs();
  const size_t decode[][2] = {  // kc, nc
    {1024, 1024}, {1024, 2816}, {2816, 1024}, {1024, 32000}, {2048, 2048}, {2048, 8192}, {8192, 2048},
  };
  time_shapes(&pairs[0], 1, decode, sizeof(decode) / sizeof(decode[0]));
  const size_t prefill[][2] = {{1024, 1024}, {1024, 2816}, {2816, 1024}, {1024, 32000}};
  time_shapes(&pairs[1], 16, prefill, sizeof(prefill) / sizeof(prefill[0]));
  time_streamed_token();
  return wrong != 0;
}
