// xnnblob's qd8 x qb4w GEMM tile for aarch64 CPUs without the dot product (Armv8.0: the
// Cortex-A53/A55-without-dot class): 4 rows by 8 columns over XNNPACK's own 16-column kr-1
// packing of blockwise 4-bit weights, the layout its 6x16 neon_mlal_lane kernel reads.
//
// Why: XNNPACK's 6x16 kernel keeps 24 int32 and 24 f32 accumulators, which with its operands
// need far more than 32 vector registers: its inner loop spills and reloads accumulators and
// copies registers about, 0.52 instructions per multiply-add where its smlal instructions alone
// take 0.25. Half the columns of 4 rows keep every accumulator in registers: 0.38. Each output
// goes through the same operations in the same order as XNNPACK's kernel (the column's k-sum
// times the row's zero point; per block the int32 sum, converted, fused-multiply-added with the
// block's scale; the bias plus that times the row's scale, fused; clamped), so the results are
// bit-identical.
//
// Weights, per 16 columns: 16 f32 k-sums; per block of bl values, per 2 values of k, 16 bytes
// (columns 0-15: each byte's low nibble is the even k, its high nibble the odd one, values
// times 16); then 16 bf16 scales; after the last block 16 f32 biases. A tile loads whole 16-byte
// lines and widens its half of each (sxtl for columns 0-7, sxtl2 for 8-15).

#include "macros.inc"

  .arch armv8-a
  .text

// void xnnblob_qd8_qb4w_mlal_4x8_{lo,hi}(const struct xnnblob_qd8_qb4w_tile* t);
// struct xnnblob_qd8_qb4w_tile (qd8-f32-qb4w-gemm.c), offsets in bytes:
//   0 rows[4]        the 4 rows' int8 values (a row repeated where there are fewer)
//  32 ksums          this half's 8 k-sums
//  40 weights        the group's values of the first block (both halves)
//  48 biases         this half's 8 biases
//  56 blocks         blocks of k
//  64 steps          8-value steps of k per block (bl / 8)
//  80 quantization   the 4 rows' {int32 zero point, f32 scale}
//  88 out            4 rows of 8 floats
//  96 out_stride     bytes between them
// 104 clamp          {min, max}
.macro MLAL_4x8 name, widen, from, scales
  .p2align 4
  .global \name
  .hidden \name
  .type \name, %function
\name:
  stp d8, d9, [sp, #-48]!
  stp d10, d11, [sp, #16]
  stp d12, d13, [sp, #32]
  ldp x9, x10, [x0]
  ldp x11, x12, [x0, #16]
  ldp x13, x2, [x0, #32]
  ldp x14, x3, [x0, #48]
  ldr x6, [x0, #64]
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
2:  // 8 values of k: the rows widened in v8-v11 (by-element smlal takes v0-v15), 4 lines of
  // weights in v24-v27
  ldr d8, [x9], #8
  ldr d9, [x10], #8
  ldr d10, [x11], #8
  ldr d11, [x12], #8
  ld1 {v24.16b-v27.16b}, [x2], #64
  sxtl v8.8h, v8.8b
  sxtl v9.8h, v9.8b
  sxtl v10.8h, v10.8b
  sxtl v11.8h, v11.8b
  MLAL_LINE \widen, \from, v24, 0, 1
  MLAL_LINE \widen, \from, v25, 2, 3
  MLAL_LINE \widen, \from, v26, 4, 5
  MLAL_LINE \widen, \from, v27, 6, 7
  subs x7, x7, #1
  b.ne 2b
  // The block's scales for this half (bf16 -> f32), then past the group's 16 to the next block.
  ldr q12, [x2, #\scales]
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
  // The bias plus the sums times each row's scale (one fused step), clamped.
  ldp q28, q29, [x16]
  ldp q24, q25, [x14]
  mov v0.16b, v24.16b
  mov v1.16b, v25.16b
  mov v2.16b, v24.16b
  mov v3.16b, v25.16b
  mov v4.16b, v24.16b
  mov v5.16b, v25.16b
  mov v6.16b, v24.16b
  mov v7.16b, v25.16b
  fmla v0.4s, v16.4s, v28.s[1]
  fmla v1.4s, v17.4s, v28.s[1]
  fmla v2.4s, v18.4s, v28.s[3]
  fmla v3.4s, v19.4s, v28.s[3]
  fmla v4.4s, v20.4s, v29.s[1]
  fmla v5.4s, v21.4s, v29.s[1]
  fmla v6.4s, v22.4s, v29.s[3]
  fmla v7.4s, v23.4s, v29.s[3]
  ld1r {v26.4s}, [x5], #4
  ld1r {v27.4s}, [x5]
  CLAMP v26.4s, v27.4s, v0.4s, v1.4s, v2.4s, v3.4s, v4.4s, v5.4s, v6.4s, v7.4s
  stp q0, q1, [x17]
  add x17, x17, x4
  stp q2, q3, [x17]
  add x17, x17, x4
  stp q4, q5, [x17]
  add x17, x17, x4
  stp q6, q7, [x17]
  ldp d12, d13, [sp, #32]
  ldp d10, d11, [sp, #16]
  ldp d8, d9, [sp], #48
  ret
  .size \name, .-\name
.endm

// One 16-byte line of weights (two values of k, 16 columns): its even k (low nibbles) and odd k
// (high nibbles), this half widened to int16, multiplied by each row's value of that k.
.macro MLAL_LINE widen, from, line, even, odd
  shl v28.16b, \line\().16b, #4
  and v29.16b, \line\().16b, v30.16b
  \widen v12.8h, v28.\from
  smlal v0.4s, v12.4h, v8.h[\even]
  smlal2 v1.4s, v12.8h, v8.h[\even]
  smlal v2.4s, v12.4h, v9.h[\even]
  smlal2 v3.4s, v12.8h, v9.h[\even]
  smlal v4.4s, v12.4h, v10.h[\even]
  smlal2 v5.4s, v12.8h, v10.h[\even]
  smlal v6.4s, v12.4h, v11.h[\even]
  smlal2 v7.4s, v12.8h, v11.h[\even]
  \widen v13.8h, v29.\from
  smlal v0.4s, v13.4h, v8.h[\odd]
  smlal2 v1.4s, v13.8h, v8.h[\odd]
  smlal v2.4s, v13.4h, v9.h[\odd]
  smlal2 v3.4s, v13.8h, v9.h[\odd]
  smlal v4.4s, v13.4h, v10.h[\odd]
  smlal2 v5.4s, v13.8h, v10.h[\odd]
  smlal v6.4s, v13.4h, v11.h[\odd]
  smlal2 v7.4s, v13.8h, v11.h[\odd]
.endm

MLAL_4x8 xnnblob_qd8_qb4w_mlal_4x8_lo, sxtl, 8b, 0
MLAL_4x8 xnnblob_qd8_qb4w_mlal_4x8_hi, sxtl2, 16b, 16

// One 16-byte line of weights for one row: its even and odd k, all 16 columns widened (sxtl for
// 0-7, sxtl2 for 8-15), times the row's value of that k.
.macro MLAL_ROW_LINE line, even, odd
  shl v28.16b, \line\().16b, #4
  and v29.16b, \line\().16b, v30.16b
  sxtl v12.8h, v28.8b
  sxtl2 v13.8h, v28.16b
  smlal v0.4s, v12.4h, v8.h[\even]
  smlal2 v1.4s, v12.8h, v8.h[\even]
  smlal v2.4s, v13.4h, v8.h[\even]
  smlal2 v3.4s, v13.8h, v8.h[\even]
  sxtl v12.8h, v29.8b
  sxtl2 v13.8h, v29.16b
  smlal v0.4s, v12.4h, v8.h[\odd]
  smlal2 v1.4s, v12.8h, v8.h[\odd]
  smlal v2.4s, v13.4h, v8.h[\odd]
  smlal2 v3.4s, v13.8h, v8.h[\odd]
.endm

// void xnnblob_qd8_qb4w_mlal_1x16(const struct xnnblob_qd8_qb4w_tile* t);
// One row (rows[0]) by a whole 16-column group (ksums, biases: its 16; out: 16 floats), for a
// decoded token: XNNPACK's 1x16 kernel widens each line of weights the same way, but builds each
// from 8-byte halves and re-reads its accumulators: 0.64 instructions per multiply-add, here 0.5.
// Same operations per output as XNNPACK's 1x16 kernel.
  .p2align 4
  .global xnnblob_qd8_qb4w_mlal_1x16
  .hidden xnnblob_qd8_qb4w_mlal_1x16
  .type xnnblob_qd8_qb4w_mlal_1x16, %function
xnnblob_qd8_qb4w_mlal_1x16:
  stp d8, d9, [sp, #-48]!
  stp d10, d11, [sp, #16]
  stp d12, d13, [sp, #32]
  ldr x9, [x0]
  ldp x13, x2, [x0, #32]
  ldp x14, x3, [x0, #48]
  ldr x6, [x0, #64]
  ldp x16, x17, [x0, #80]
  ldr x5, [x0, #104]
  // Start from each column's k-sum times the row's zero point.
  ld1 {v24.4s-v27.4s}, [x13]
  ld1r {v28.4s}, [x16]
  scvtf v28.4s, v28.4s
  fmul v16.4s, v24.4s, v28.4s
  fmul v17.4s, v25.4s, v28.4s
  fmul v18.4s, v26.4s, v28.4s
  fmul v19.4s, v27.4s, v28.4s
  movi v30.16b, #0xf0
1:  // a block
  ZERO v0.4s, v1.4s, v2.4s, v3.4s
  mov x7, x6
2:  // 8 values of k: the row widened in v8, 4 lines of weights in v24-v27
  ldr d8, [x9], #8
  ld1 {v24.16b-v27.16b}, [x2], #64
  sxtl v8.8h, v8.8b
  MLAL_ROW_LINE v24, 0, 1
  MLAL_ROW_LINE v25, 2, 3
  MLAL_ROW_LINE v26, 4, 5
  MLAL_ROW_LINE v27, 6, 7
  subs x7, x7, #1
  b.ne 2b
  // The block's 16 scales (bf16 -> f32).
  ldp q12, q13, [x2], #32
  shll v24.4s, v12.4h, #16
  shll2 v25.4s, v12.8h, #16
  shll v26.4s, v13.4h, #16
  shll2 v27.4s, v13.8h, #16
  TO_F32 0, v0.4s, v1.4s, v2.4s, v3.4s
  fmla v16.4s, v0.4s, v24.4s
  fmla v17.4s, v1.4s, v25.4s
  fmla v18.4s, v2.4s, v26.4s
  fmla v19.4s, v3.4s, v27.4s
  subs x3, x3, #1
  b.ne 1b
  // The bias plus the sums times the row's scale (one fused step), clamped.
  add x16, x16, #4
  ld1r {v28.4s}, [x16]
  ld1 {v0.4s-v3.4s}, [x14]
  fmla v0.4s, v16.4s, v28.4s
  fmla v1.4s, v17.4s, v28.4s
  fmla v2.4s, v18.4s, v28.4s
  fmla v3.4s, v19.4s, v28.4s
  ld1r {v26.4s}, [x5], #4
  ld1r {v27.4s}, [x5]
  CLAMP v26.4s, v27.4s, v0.4s, v1.4s, v2.4s, v3.4s
  st1 {v0.4s-v3.4s}, [x17]
  ldp d12, d13, [sp, #32]
  ldp d10, d11, [sp, #16]
  ldp d8, d9, [sp], #48
  ret
  .size xnnblob_qd8_qb4w_mlal_1x16, .-xnnblob_qd8_qb4w_mlal_1x16

  .section .note.GNU-stack,"",%progbits
