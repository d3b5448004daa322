// Whether the emulator computes SME outer products right: one fp32 FMOPA and one int8 SMOPA
// (4-way sums into 32-bit tiles, what quantized GEMM kernels use) into tile 0 of ZA, stored back
// row by row with the same ST1W loop, each compared with a plain C reference. Prints
// "fmopa WRONG/N smopa WRONG/N" (wrong elements of N). Built for aarch64 by
// faces/executorch/tests/aarch64.rs and run under qemu-aarch64 on an SME CPU model. GCC 12 knows
// no +sme, so the assembler is told in each asm block.
#include <stdint.h>
#include <stdio.h>

#define STORE_TILE0                                                                   \
  "mov w12, #0\n"                                                                     \
  "mov x9, %[out]\n"                                                                  \
  "1:\n"                                                                              \
  "st1w {za0h.s[w12, 0]}, p0, [x9]\n"                                                 \
  "addvl x9, x9, #1\n"                                                                \
  "add w12, w12, #1\n"                                                                \
  "cmp w12, %w[rows]\n"                                                               \
  "b.lt 1b\n"

static float fa[64], fb[64], fout[64 * 64];
static int8_t ia[256], ib[256];
static int32_t iout[64 * 64];

int main(void) {
  uint64_t svl;  // streaming vector length in bytes
  __asm__ volatile(".arch_extension sme\nrdsvl %0, #1" : "=r"(svl));
  int rows = (int)(svl / 4);
  if (rows > 64) rows = 64;
  for (int i = 0; i < 64; i++) {
    fa[i] = (float)(i * 3 - 7);
    fb[i] = (float)(i * 5 + 1);
  }
  for (int i = 0; i < 256; i++) {
    ia[i] = (int8_t)(i * 37 - 100);
    ib[i] = (int8_t)(i * 11 + 5);
  }
  __asm__ volatile(
      ".arch_extension sme\n"
      "smstart\n"
      "zero {za}\n"
      "ptrue p0.s\n"
      "ld1w {z0.s}, p0/z, [%[a]]\n"
      "ld1w {z1.s}, p0/z, [%[b]]\n"
      "fmopa za0.s, p0/m, p0/m, z0.s, z1.s\n" STORE_TILE0 "smstop\n"
      :
      : [a] "r"(fa), [b] "r"(fb), [out] "r"(fout), [rows] "r"(rows)
      : "x9", "x12", "memory", "cc");
  __asm__ volatile(
      ".arch_extension sme\n"
      "smstart\n"
      "zero {za}\n"
      "ptrue p0.b\n"
      "ld1b {z0.b}, p0/z, [%[a]]\n"
      "ld1b {z1.b}, p0/z, [%[b]]\n"
      "smopa za0.s, p0/m, p0/m, z0.b, z1.b\n" STORE_TILE0 "smstop\n"
      :
      : [a] "r"(ia), [b] "r"(ib), [out] "r"(iout), [rows] "r"(rows)
      : "x9", "x12", "memory", "cc");
  int fwrong = 0, iwrong = 0;
  for (int i = 0; i < rows; i++) {
    for (int j = 0; j < rows; j++) {
      if (fout[i * rows + j] != fa[i] * fb[j]) fwrong++;
      int32_t want = 0;
      for (int k = 0; k < 4; k++) want += ia[4 * i + k] * ib[4 * j + k];
      if (iout[i * rows + j] != want) iwrong++;
    }
  }
  printf("fmopa %d/%d smopa %d/%d\n", fwrong, rows * rows, iwrong, rows * rows);
  return 0;
}
