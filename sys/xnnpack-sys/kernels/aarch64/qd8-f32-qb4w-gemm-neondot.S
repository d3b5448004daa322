// xnnblob's qd8 x qb4w GEMM tile for aarch64 CPUs with the dot product but no i8mm (the
// Cortex-A76/A77/A78, Neoverse N1 class): 4 rows by 8 columns over XNNPACK's own 16-column c4
// packing of blockwise 4-bit weights, the layout its 4x16c4 neondot kernel reads.
//
// Why: XNNPACK's 4x16c4 kernel keeps 4 rows by 16 columns in flight, 16 int32 and 16 f32
// accumulators, more than the 32 vector registers hold beside its operands, so every block of
// 32 values of k spills and reloads the f32 sums and copies registers about: 2.28 instructions
// per sdot. Half the columns at a time keep everything in registers, and 16 values of a row
// load at once: 1.95. Each output goes through the same operations in the same order as
// XNNPACK's kernel (the column's k-sum times the row's zero point; per block the int32 sum,
// converted, fused-multiply-added with the block's scale; times the row's scale; plus the bias;
// clamped), so the results are bit-identical.
//
// Weights, per 16 columns: 16 f32 k-sums; per block of bl values, per 8 values of k, 64 bytes
// (16 per 4 columns: each byte's low nibble is one of k 0-3 of a column, its high nibble one of
// k 4-7, values times 16), then 16 bf16 scales; after the last block 16 f32 biases.

#include "macros.inc"

  .arch armv8.2-a+dotprod
  .text

// Columns 0-3 (weights in \lo) and 4-7 (\hi) of 4 values of k, times each row's 4 values of
// that k (lane \lane of v24-v27), into the sums v0-v7.
.macro DOT_ROWS lo, hi, lane
  sdot v0.4s, \lo\().16b, v24.4b[\lane]
  sdot v1.4s, \hi\().16b, v24.4b[\lane]
  sdot v2.4s, \lo\().16b, v25.4b[\lane]
  sdot v3.4s, \hi\().16b, v25.4b[\lane]
  sdot v4.4s, \lo\().16b, v26.4b[\lane]
  sdot v5.4s, \hi\().16b, v26.4b[\lane]
  sdot v6.4s, \lo\().16b, v27.4b[\lane]
  sdot v7.4s, \hi\().16b, v27.4b[\lane]
.endm

// 16 values of k of 4 rows by 8 columns: rows in v24-v27, weights of 8 values in v8/v9, of the
// next 8 in v10/v11 (this half's 32 bytes of each 64), sums in v0-v7.
.macro DOT_16_VALUES
  ldr q24, [x9], #16
  ldr q25, [x10], #16
  ldr q26, [x11], #16
  ldr q27, [x12], #16
  ldp q8, q9, [x2], #64
  ldp q10, q11, [x2], #64
  shl v12.16b, v8.16b, #4
  shl v13.16b, v9.16b, #4
  DOT_ROWS v12, v13, 0
  and v8.16b, v8.16b, v30.16b
  and v9.16b, v9.16b, v30.16b
  DOT_ROWS v8, v9, 1
  shl v12.16b, v10.16b, #4
  shl v13.16b, v11.16b, #4
  DOT_ROWS v12, v13, 2
  and v10.16b, v10.16b, v30.16b
  and v11.16b, v11.16b, v30.16b
  DOT_ROWS v10, v11, 3
.endm

// void xnnblob_qd8_qb4w_dot_4x8(const struct xnnblob_qd8_qb4w_tile* t);
// struct xnnblob_qd8_qb4w_tile (qd8-f32-qb4w-gemm.c), offsets in bytes:
//   0 rows[4]        the 4 rows' int8 values (a row repeated where there are fewer)
//  32 ksums          this half's 8 k-sums
//  40 weights        this half's values of the first block (the group's, +64, +32 for the
//                    second half)
//  48 biases         this half's 8 biases
//  56 blocks         blocks of k
//  64 steps          32-value steps of k per block (bl / 32)
//  72 scales_at      from the end of a block's values to this half's scales: -16 x half
//  80 quantization   the 4 rows' {int32 zero point, f32 scale}
//  88 out            4 rows of 8 floats
//  96 out_stride     bytes between them
// 104 clamp          {min, max}
  .p2align 4
  .global xnnblob_qd8_qb4w_dot_4x8
  .hidden xnnblob_qd8_qb4w_dot_4x8
  .type xnnblob_qd8_qb4w_dot_4x8, %function
xnnblob_qd8_qb4w_dot_4x8:
  stp d8, d9, [sp, #-48]!
  stp d10, d11, [sp, #16]
  stp d12, d13, [sp, #32]
  ldp x9, x10, [x0]
  ldp x11, x12, [x0, #16]
  ldp x13, x2, [x0, #32]
  ldp x14, x3, [x0, #48]
  ldp x6, x15, [x0, #64]
  ldp x16, x17, [x0, #80]
  ldp x4, x5, [x0, #96]
  // Start from each column's k-sum times each row's zero point.
  ldp q26, q27, [x13]
  ldp q28, q29, [x16]
  scvtf v24.4s, v28.4s
  scvtf v25.4s, v29.4s
  fmul v16.4s, v26.4s, v24.s[0]
  fmul v17.4s, v27.4s, v24.s[0]
  fmul v18.4s, v26.4s, v24.s[2]
  fmul v19.4s, v27.4s, v24.s[2]
  fmul v20.4s, v26.4s, v25.s[0]
  fmul v21.4s, v27.4s, v25.s[0]
  fmul v22.4s, v26.4s, v25.s[2]
  fmul v23.4s, v27.4s, v25.s[2]
  movi v30.16b, #0xf0
1:  // a block
  ZERO v0.4s, v1.4s, v2.4s, v3.4s, v4.4s, v5.4s, v6.4s, v7.4s
  mov x7, x6
2:  // 32 values of k, 16 at a time: rows in v24-v27, weights of 8 values in v8/v9, of the
  // next 8 in v10/v11 (this half's 32 bytes of each 64)
  DOT_16_VALUES
  DOT_16_VALUES
  subs x7, x7, #1
  b.ne 2b
  // The block's scales for this half (bf16 -> f32), then past the group's 16 to the next block.
  ldr q12, [x2, x15]
  add x2, x2, #32
  shll v13.4s, v12.4h, #16
  shll2 v12.4s, v12.8h, #16
  TO_F32 0, v0.4s, v1.4s, v2.4s, v3.4s, v4.4s, v5.4s, v6.4s, v7.4s
  fmla v16.4s, v0.4s, v13.4s
  fmla v17.4s, v1.4s, v12.4s
  fmla v18.4s, v2.4s, v13.4s
  fmla v19.4s, v3.4s, v12.4s
  fmla v20.4s, v4.4s, v13.4s
  fmla v21.4s, v5.4s, v12.4s
  fmla v22.4s, v6.4s, v13.4s
  fmla v23.4s, v7.4s, v12.4s
  subs x3, x3, #1
  b.ne 1b
  // Times each row's scale, plus the bias, clamped.
  ldp q28, q29, [x16]
  fmul v16.4s, v16.4s, v28.s[1]
  fmul v17.4s, v17.4s, v28.s[1]
  fmul v18.4s, v18.4s, v28.s[3]
  fmul v19.4s, v19.4s, v28.s[3]
  fmul v20.4s, v20.4s, v29.s[1]
  fmul v21.4s, v21.4s, v29.s[1]
  fmul v22.4s, v22.4s, v29.s[3]
  fmul v23.4s, v23.4s, v29.s[3]
  ldp q24, q25, [x14]
  ld1r {v26.4s}, [x5], #4
  ld1r {v27.4s}, [x5]
  fadd v16.4s, v24.4s, v16.4s
  fadd v17.4s, v25.4s, v17.4s
  fadd v18.4s, v24.4s, v18.4s
  fadd v19.4s, v25.4s, v19.4s
  fadd v20.4s, v24.4s, v20.4s
  fadd v21.4s, v25.4s, v21.4s
  fadd v22.4s, v24.4s, v22.4s
  fadd v23.4s, v25.4s, v23.4s
  CLAMP v26.4s, v27.4s, v16.4s, v17.4s, v18.4s, v19.4s, v20.4s, v21.4s, v22.4s, v23.4s
  stp q16, q17, [x17]
  add x17, x17, x4
  stp q18, q19, [x17]
  add x17, x17, x4
  stp q20, q21, [x17]
  add x17, x17, x4
  stp q22, q23, [x17]
  ldp d12, d13, [sp, #32]
  ldp d10, d11, [sp, #16]
  ldp d8, d9, [sp], #48
  ret
  .size xnnblob_qd8_qb4w_dot_4x8, .-xnnblob_qd8_qb4w_dot_4x8

  .section .note.GNU-stack,"",%progbits
