// xnnblob's qp8 x qb4w GEMM tiles for aarch64: activations in KleidiAI's qai8dxp layout (int8,
// a zero-point offset and a scale per row), weights in its qsi4c32p4x8 layout (signed 4-bit, a
// bf16 scale per block of bl values along k, bl a multiple of 32), f32 out.
//
// Why: KleidiAI's i8mm kernel (16x4x32, which XNNPACK runs for a prompt) keeps 16 rows by 4
// columns in flight, so each block's int32 sums go through a transpose (uzp) and its f32 sums
// live on the stack or are rebuilt 4 rows at a time: 2.9 instructions per smmla. An 8x4 tile
// keeps its int32 and f32 sums in registers in smmla's own 2x2 order and loads 64 bytes an
// instruction: 2.4. For one row (a decoded token), KleidiAI's 1x4x32 dot-product kernel loads
// the row's values once per 4 columns; 1x8 shares them between two column groups.
//
// Each output is computed with the same operations in the same order as KleidiAI's kernels
// (per block: int32 sum, converted with a 1/16 fixed-point scale, fused-multiply-added with the
// block's scale; then the row offset times the column sum fused in, times the row scale, plus
// the bias, clamped), so the results are bit-identical to theirs.
//
// Layouts, per 32 values of k ("a chunk"):
//   weights, per 4 columns: 64 bytes; byte j of 16-byte part p holds two values, its low nibble
//     for k 0-15 and its high nibble for k 16-31 (parts 0/1: columns 0-1/2-3 for k 0-7 and
//     16-23; parts 2/3: the same for k 8-15 and 24-31). After a block's chunks its 4 bf16
//     scales; after the last block 4 f32 column sums and 4 f32 biases.
//   activations, 4-row group (i8mm): 8 values of rows 0-1, of rows 2-3, for k 0-7, then 8-15,
//     16-23, 24-31 (128 bytes); after all of k, 4 int32 offsets and 4 f32 scales.
//   activations, one row (dot product): k 0-7, 8-15, 16-23, 24-31 (32 bytes); after all of k,
//     an int32 offset and an f32 scale.
// The 4-bit values are used times 16 (shifted to the high nibble, or masked there), which the
// conversion's 1/16 undoes exactly.

#include "macros.inc"

  .arch armv8.2-a+dotprod+i8mm
  .text

// void xnnblob_qp8_qb4w_i8mm_8x4(const int8_t* lhs0, const int8_t* lhs1, const uint8_t* rhs,
//     size_t blocks, size_t chunks, float* dst, size_t dst_stride, const float clamp[2]);
// Rows 0-3 from the group at lhs0, rows 4-7 from the group at lhs1, columns 0-3 from rhs; 8
// rows of 4 floats to dst, dst_stride bytes apart. v0-v7: int32 sums of a block, v16-v23: f32
// sums, both in smmla's 2x2 order (group g, row pair p: columns 0-1, then 2-3).
  .p2align 4
  .global xnnblob_qp8_qb4w_i8mm_8x4
  .hidden xnnblob_qp8_qb4w_i8mm_8x4
  .type xnnblob_qp8_qb4w_i8mm_8x4, %function
xnnblob_qp8_qb4w_i8mm_8x4:
  stp d8, d9, [sp, #-64]!
  stp d10, d11, [sp, #16]
  stp d12, d13, [sp, #32]
  stp d14, d15, [sp, #48]
  movi v30.16b, #0xf0
  ZERO v16.4s, v17.4s, v18.4s, v19.4s, v20.4s, v21.4s, v22.4s, v23.4s
1:  // a block
  ZERO v0.4s, v1.4s, v2.4s, v3.4s, v4.4s, v5.4s, v6.4s, v7.4s
  mov x8, x4
2:  // 32 values of k
  ld1 {v24.16b-v27.16b}, [x2], #64
  ld1 {v8.16b-v11.16b}, [x0], #64
  ld1 {v12.16b-v15.16b}, [x1], #64
  shl v28.16b, v24.16b, #4
  shl v29.16b, v25.16b, #4
  smmla v0.4s, v8.16b, v28.16b
  smmla v1.4s, v8.16b, v29.16b
  smmla v2.4s, v9.16b, v28.16b
  smmla v3.4s, v9.16b, v29.16b
  smmla v4.4s, v12.16b, v28.16b
  smmla v5.4s, v12.16b, v29.16b
  smmla v6.4s, v13.16b, v28.16b
  smmla v7.4s, v13.16b, v29.16b
  shl v28.16b, v26.16b, #4
  shl v29.16b, v27.16b, #4
  smmla v0.4s, v10.16b, v28.16b
  smmla v1.4s, v10.16b, v29.16b
  smmla v2.4s, v11.16b, v28.16b
  smmla v3.4s, v11.16b, v29.16b
  smmla v4.4s, v14.16b, v28.16b
  smmla v5.4s, v14.16b, v29.16b
  smmla v6.4s, v15.16b, v28.16b
  smmla v7.4s, v15.16b, v29.16b
  ld1 {v8.16b-v11.16b}, [x0], #64
  ld1 {v12.16b-v15.16b}, [x1], #64
  and v28.16b, v24.16b, v30.16b
  and v29.16b, v25.16b, v30.16b
  smmla v0.4s, v8.16b, v28.16b
  smmla v1.4s, v8.16b, v29.16b
  smmla v2.4s, v9.16b, v28.16b
  smmla v3.4s, v9.16b, v29.16b
  smmla v4.4s, v12.16b, v28.16b
  smmla v5.4s, v12.16b, v29.16b
  smmla v6.4s, v13.16b, v28.16b
  smmla v7.4s, v13.16b, v29.16b
  and v28.16b, v26.16b, v30.16b
  and v29.16b, v27.16b, v30.16b
  smmla v0.4s, v10.16b, v28.16b
  smmla v1.4s, v10.16b, v29.16b
  smmla v2.4s, v11.16b, v28.16b
  smmla v3.4s, v11.16b, v29.16b
  smmla v4.4s, v14.16b, v28.16b
  smmla v5.4s, v14.16b, v29.16b
  smmla v6.4s, v15.16b, v28.16b
  smmla v7.4s, v15.16b, v29.16b
  subs x8, x8, #1
  b.ne 2b
  // The block's scales, bf16 -> f32, as columns [0,1,0,1] and [2,3,2,3].
  ldr d24, [x2], #8
  shll v24.4s, v24.4h, #16
  dup v25.2d, v24.d[0]
  dup v26.2d, v24.d[1]
  TO_F32 4, v0.4s, v1.4s, v2.4s, v3.4s, v4.4s, v5.4s, v6.4s, v7.4s
  fmla v16.4s, v0.4s, v25.4s
  fmla v17.4s, v1.4s, v26.4s
  fmla v18.4s, v2.4s, v25.4s
  fmla v19.4s, v3.4s, v26.4s
  fmla v20.4s, v4.4s, v25.4s
  fmla v21.4s, v5.4s, v26.4s
  fmla v22.4s, v6.4s, v25.4s
  fmla v23.4s, v7.4s, v26.4s
  subs x3, x3, #1
  b.ne 1b
  // Rows from the 2x2 order; then each row's offset (times the column sums), scale, the bias
  // and the clamp, in KleidiAI's order.
  uzp1 v0.2d, v16.2d, v17.2d
  uzp2 v1.2d, v16.2d, v17.2d
  uzp1 v2.2d, v18.2d, v19.2d
  uzp2 v3.2d, v18.2d, v19.2d
  uzp1 v4.2d, v20.2d, v21.2d
  uzp2 v5.2d, v20.2d, v21.2d
  uzp1 v6.2d, v22.2d, v23.2d
  uzp2 v7.2d, v22.2d, v23.2d
  ldp q24, q25, [x0]
  ldp q26, q27, [x1]
  ldp q28, q29, [x2]
  ld1r {v30.4s}, [x7], #4
  ld1r {v31.4s}, [x7]
  scvtf v24.4s, v24.4s
  scvtf v26.4s, v26.4s
  fmla v0.4s, v28.4s, v24.s[0]
  fmla v1.4s, v28.4s, v24.s[1]
  fmla v2.4s, v28.4s, v24.s[2]
  fmla v3.4s, v28.4s, v24.s[3]
  fmla v4.4s, v28.4s, v26.s[0]
  fmla v5.4s, v28.4s, v26.s[1]
  fmla v6.4s, v28.4s, v26.s[2]
  fmla v7.4s, v28.4s, v26.s[3]
  fmul v0.4s, v0.4s, v25.s[0]
  fmul v1.4s, v1.4s, v25.s[1]
  fmul v2.4s, v2.4s, v25.s[2]
  fmul v3.4s, v3.4s, v25.s[3]
  fmul v4.4s, v4.4s, v27.s[0]
  fmul v5.4s, v5.4s, v27.s[1]
  fmul v6.4s, v6.4s, v27.s[2]
  fmul v7.4s, v7.4s, v27.s[3]
  fadd v0.4s, v0.4s, v29.4s
  fadd v1.4s, v1.4s, v29.4s
  fadd v2.4s, v2.4s, v29.4s
  fadd v3.4s, v3.4s, v29.4s
  fadd v4.4s, v4.4s, v29.4s
  fadd v5.4s, v5.4s, v29.4s
  fadd v6.4s, v6.4s, v29.4s
  fadd v7.4s, v7.4s, v29.4s
  CLAMP v30.4s, v31.4s, v0.4s, v1.4s, v2.4s, v3.4s, v4.4s, v5.4s, v6.4s, v7.4s
  st1 {v0.4s}, [x5], x6
  st1 {v1.4s}, [x5], x6
  st1 {v2.4s}, [x5], x6
  st1 {v3.4s}, [x5], x6
  st1 {v4.4s}, [x5], x6
  st1 {v5.4s}, [x5], x6
  st1 {v6.4s}, [x5], x6
  st1 {v7.4s}, [x5]
  ldp d14, d15, [sp, #48]
  ldp d12, d13, [sp, #32]
  ldp d10, d11, [sp, #16]
  ldp d8, d9, [sp], #64
  ret
  .size xnnblob_qp8_qb4w_i8mm_8x4, .-xnnblob_qp8_qb4w_i8mm_8x4

// void xnnblob_qp8_qb4w_i8mm_4x4(const int8_t* lhs, const uint8_t* rhs, size_t blocks,
//     size_t chunks, float* dst, size_t dst_stride, const float clamp[2]);
// One 4-row group: the rows of a prompt past its last whole 8.
  .p2align 4
  .global xnnblob_qp8_qb4w_i8mm_4x4
  .hidden xnnblob_qp8_qb4w_i8mm_4x4
  .type xnnblob_qp8_qb4w_i8mm_4x4, %function
xnnblob_qp8_qb4w_i8mm_4x4:
  movi v30.16b, #0xf0
  ZERO v16.4s, v17.4s, v18.4s, v19.4s
1:
  ZERO v0.4s, v1.4s, v2.4s, v3.4s
  mov x8, x3
2:
  ld1 {v24.16b-v27.16b}, [x1], #64
  ld1 {v4.16b-v7.16b}, [x0], #64
  shl v28.16b, v24.16b, #4
  shl v29.16b, v25.16b, #4
  smmla v0.4s, v4.16b, v28.16b
  smmla v1.4s, v4.16b, v29.16b
  smmla v2.4s, v5.16b, v28.16b
  smmla v3.4s, v5.16b, v29.16b
  shl v28.16b, v26.16b, #4
  shl v29.16b, v27.16b, #4
  smmla v0.4s, v6.16b, v28.16b
  smmla v1.4s, v6.16b, v29.16b
  smmla v2.4s, v7.16b, v28.16b
  smmla v3.4s, v7.16b, v29.16b
  ld1 {v4.16b-v7.16b}, [x0], #64
  and v28.16b, v24.16b, v30.16b
  and v29.16b, v25.16b, v30.16b
  smmla v0.4s, v4.16b, v28.16b
  smmla v1.4s, v4.16b, v29.16b
  smmla v2.4s, v5.16b, v28.16b
  smmla v3.4s, v5.16b, v29.16b
  and v28.16b, v26.16b, v30.16b
  and v29.16b, v27.16b, v30.16b
  smmla v0.4s, v6.16b, v28.16b
  smmla v1.4s, v6.16b, v29.16b
  smmla v2.4s, v7.16b, v28.16b
  smmla v3.4s, v7.16b, v29.16b
  subs x8, x8, #1
  b.ne 2b
  ldr d24, [x1], #8
  shll v24.4s, v24.4h, #16
  dup v25.2d, v24.d[0]
  dup v26.2d, v24.d[1]
  TO_F32 4, v0.4s, v1.4s, v2.4s, v3.4s
  fmla v16.4s, v0.4s, v25.4s
  fmla v17.4s, v1.4s, v26.4s
  fmla v18.4s, v2.4s, v25.4s
  fmla v19.4s, v3.4s, v26.4s
  subs x2, x2, #1
  b.ne 1b
  uzp1 v0.2d, v16.2d, v17.2d
  uzp2 v1.2d, v16.2d, v17.2d
  uzp1 v2.2d, v18.2d, v19.2d
  uzp2 v3.2d, v18.2d, v19.2d
  ldp q24, q25, [x0]
  ldp q28, q29, [x1]
  ld1r {v30.4s}, [x6], #4
  ld1r {v31.4s}, [x6]
  scvtf v24.4s, v24.4s
  fmla v0.4s, v28.4s, v24.s[0]
  fmla v1.4s, v28.4s, v24.s[1]
  fmla v2.4s, v28.4s, v24.s[2]
  fmla v3.4s, v28.4s, v24.s[3]
  fmul v0.4s, v0.4s, v25.s[0]
  fmul v1.4s, v1.4s, v25.s[1]
  fmul v2.4s, v2.4s, v25.s[2]
  fmul v3.4s, v3.4s, v25.s[3]
  fadd v0.4s, v0.4s, v29.4s
  fadd v1.4s, v1.4s, v29.4s
  fadd v2.4s, v2.4s, v29.4s
  fadd v3.4s, v3.4s, v29.4s
  CLAMP v30.4s, v31.4s, v0.4s, v1.4s, v2.4s, v3.4s
  st1 {v0.4s}, [x4], x5
  st1 {v1.4s}, [x4], x5
  st1 {v2.4s}, [x4], x5
  st1 {v3.4s}, [x4]
  ret
  .size xnnblob_qp8_qb4w_i8mm_4x4, .-xnnblob_qp8_qb4w_i8mm_4x4

// void xnnblob_qp8_qb4w_dot_1x8(const int8_t* lhs, const uint8_t* rhs_a,
//     const uint8_t* rhs_b, size_t blocks, size_t chunks, float dst[8], const float clamp[2]);
// One row by two 4-column groups. sdot on the 2-columns-by-8 layout gives each column's sum in
// two lanes (k 0-3 and 4-7), which addp joins before the block's scale, as KleidiAI's does.
  .p2align 4
  .global xnnblob_qp8_qb4w_dot_1x8
  .hidden xnnblob_qp8_qb4w_dot_1x8
  .type xnnblob_qp8_qb4w_dot_1x8, %function
xnnblob_qp8_qb4w_dot_1x8:
  movi v30.16b, #0xf0
  movi v16.4s, #0
  movi v17.4s, #0
1:
  ZERO v0.4s, v1.4s, v2.4s, v3.4s
  mov x8, x4
2:
  ld1 {v24.16b-v27.16b}, [x1], #64
  ld1 {v4.16b-v7.16b}, [x2], #64
  ld1r {v20.2d}, [x0], #8
  ld1r {v21.2d}, [x0], #8
  ld1r {v22.2d}, [x0], #8
  ld1r {v23.2d}, [x0], #8
  shl v28.16b, v24.16b, #4
  shl v29.16b, v25.16b, #4
  shl v18.16b, v4.16b, #4
  shl v19.16b, v5.16b, #4
  sdot v0.4s, v28.16b, v20.16b
  sdot v1.4s, v29.16b, v20.16b
  sdot v2.4s, v18.16b, v20.16b
  sdot v3.4s, v19.16b, v20.16b
  shl v28.16b, v26.16b, #4
  shl v29.16b, v27.16b, #4
  shl v18.16b, v6.16b, #4
  shl v19.16b, v7.16b, #4
  sdot v0.4s, v28.16b, v21.16b
  sdot v1.4s, v29.16b, v21.16b
  sdot v2.4s, v18.16b, v21.16b
  sdot v3.4s, v19.16b, v21.16b
  and v28.16b, v24.16b, v30.16b
  and v29.16b, v25.16b, v30.16b
  and v18.16b, v4.16b, v30.16b
  and v19.16b, v5.16b, v30.16b
  sdot v0.4s, v28.16b, v22.16b
  sdot v1.4s, v29.16b, v22.16b
  sdot v2.4s, v18.16b, v22.16b
  sdot v3.4s, v19.16b, v22.16b
  and v28.16b, v26.16b, v30.16b
  and v29.16b, v27.16b, v30.16b
  and v18.16b, v6.16b, v30.16b
  and v19.16b, v7.16b, v30.16b
  sdot v0.4s, v28.16b, v23.16b
  sdot v1.4s, v29.16b, v23.16b
  sdot v2.4s, v18.16b, v23.16b
  sdot v3.4s, v19.16b, v23.16b
  subs x8, x8, #1
  b.ne 2b
  ldr d24, [x1], #8
  ldr d25, [x2], #8
  addp v0.4s, v0.4s, v1.4s
  addp v2.4s, v2.4s, v3.4s
  shll v24.4s, v24.4h, #16
  shll v25.4s, v25.4h, #16
  scvtf v0.4s, v0.4s, #4
  scvtf v2.4s, v2.4s, #4
  fmla v16.4s, v0.4s, v24.4s
  fmla v17.4s, v2.4s, v25.4s
  subs x3, x3, #1
  b.ne 1b
  ld1r {v20.4s}, [x0], #4
  ld1r {v21.4s}, [x0]
  ldp q22, q23, [x1]
  ldp q24, q25, [x2]
  ld1r {v30.4s}, [x6], #4
  ld1r {v31.4s}, [x6]
  scvtf v20.4s, v20.4s
  fmla v16.4s, v22.4s, v20.s[0]
  fmla v17.4s, v24.4s, v20.s[0]
  fmul v16.4s, v16.4s, v21.4s
  fmul v17.4s, v17.4s, v21.4s
  fadd v16.4s, v16.4s, v23.4s
  fadd v17.4s, v17.4s, v25.4s
  CLAMP v30.4s, v31.4s, v16.4s, v17.4s
  stp q16, q17, [x5]
  ret
  .size xnnblob_qp8_qb4w_dot_1x8, .-xnnblob_qp8_qb4w_dot_1x8

// void xnnblob_qp8_qb4w_dot_1x4(const int8_t* lhs, const uint8_t* rhs, size_t blocks,
//     size_t chunks, float dst[4], const float clamp[2]);  one row by one 4-column group.
  .p2align 4
  .global xnnblob_qp8_qb4w_dot_1x4
  .hidden xnnblob_qp8_qb4w_dot_1x4
  .type xnnblob_qp8_qb4w_dot_1x4, %function
xnnblob_qp8_qb4w_dot_1x4:
  movi v30.16b, #0xf0
  movi v16.4s, #0
1:
  movi v0.4s, #0
  movi v1.4s, #0
  mov x8, x3
2:
  ld1 {v24.16b-v27.16b}, [x1], #64
  ld1r {v20.2d}, [x0], #8
  ld1r {v21.2d}, [x0], #8
  ld1r {v22.2d}, [x0], #8
  ld1r {v23.2d}, [x0], #8
  shl v28.16b, v24.16b, #4
  shl v29.16b, v25.16b, #4
  sdot v0.4s, v28.16b, v20.16b
  sdot v1.4s, v29.16b, v20.16b
  shl v28.16b, v26.16b, #4
  shl v29.16b, v27.16b, #4
  sdot v0.4s, v28.16b, v21.16b
  sdot v1.4s, v29.16b, v21.16b
  and v28.16b, v24.16b, v30.16b
  and v29.16b, v25.16b, v30.16b
  sdot v0.4s, v28.16b, v22.16b
  sdot v1.4s, v29.16b, v22.16b
  and v28.16b, v26.16b, v30.16b
  and v29.16b, v27.16b, v30.16b
  sdot v0.4s, v28.16b, v23.16b
  sdot v1.4s, v29.16b, v23.16b
  subs x8, x8, #1
  b.ne 2b
  ldr d24, [x1], #8
  addp v0.4s, v0.4s, v1.4s
  shll v24.4s, v24.4h, #16
  scvtf v0.4s, v0.4s, #4
  fmla v16.4s, v0.4s, v24.4s
  subs x2, x2, #1
  b.ne 1b
  ld1r {v20.4s}, [x0], #4
  ld1r {v21.4s}, [x0]
  ldp q22, q23, [x1]
  ld1r {v30.4s}, [x5], #4
  ld1r {v31.4s}, [x5]
  scvtf v20.4s, v20.4s
  fmla v16.4s, v22.4s, v20.s[0]
  fmul v16.4s, v16.4s, v21.4s
  fadd v16.4s, v16.4s, v23.4s
  CLAMP v30.4s, v31.4s, v16.4s
  str q16, [x4]
  ret
  .size xnnblob_qp8_qb4w_dot_1x4, .-xnnblob_qp8_qb4w_dot_1x4

  .section .note.GNU-stack,"",%progbits
