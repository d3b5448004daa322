//! xnnblob's own GEMM kernels for aarch64 (`sys/xnnpack-sys/kernels/aarch64`) give, bit for
//! bit, the outputs of the kernels they replace in XNNPACK's configurations, on the same packed
//! operands, and write nothing outside their m x n:
//! - patch 0026, CPUs with i8mm: the qp8 x qb4w prompt kernel (8- and 4-row tiles) and one-row
//!   kernel (8 and 4 columns) against KleidiAI 1.8.0's 16x4x32 i8mm and 1x4x32 dot-product
//!   kernels, linked into this binary with XNNPACK;
//! - patch 0027, CPUs without i8mm: the qd8 x qb4w 4-row kernels against XNNPACK's own
//!   4x16c4 neondot kernel (with the dot product) and 6x16 neon_mlal_lane kernel (without), and
//!   the one-row kernel against its 1x16 neon_mlal_lane kernel, also linked here.
//!
//! Every partial row and column count, one and several 32-value chunks per block, with and
//! without a clamp. The operands are random bytes in the packed layouts (the kernels read
//! nothing else), with zero points, scales, sums and biases of the magnitudes real packing gives.

#[cfg(all(target_arch = "aarch64", target_env = "gnu"))]
mod on_aarch64 {
    use std::ffi::c_void;

    #[repr(C)]
    struct Qb4wMinmaxParams {
        min: f32,
        max: f32,
        blocksize: usize,
    }

    /// `struct xnn_qd8_quantization_params`: a row's zero point and scale.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Qd8QuantizationParams {
        zero_point: i32,
        scale: f32,
    }

    type Kernel = unsafe extern "C" fn(
        m: usize,
        n: usize,
        k: usize,
        lhs: *const c_void,
        rhs: *const c_void,
        dst: *mut f32,
        dst_stride_row: usize,
        dst_stride_col: usize,
        params: *const Qb4wMinmaxParams,
    );

    type KaiKernel = unsafe extern "C" fn(
        m: usize,
        n: usize,
        k: usize,
        bl: usize,
        lhs: *const c_void,
        rhs: *const c_void,
        dst: *mut f32,
        dst_stride_row: usize,
        dst_stride_col: usize,
        min: f32,
        max: f32,
    );

    unsafe extern "C" {
        // sys/xnnpack-sys/kernels/aarch64/qp8-f32-qb4w-gemm.c, built into XNNPACK.
        fn xnnblob_qp8_f32_qb4w_gemm_minmax_ukernel_8x4c16s2__neoni8mm(
            m: usize,
            n: usize,
            k: usize,
            lhs: *const c_void,
            rhs: *const c_void,
            dst: *mut f32,
            dst_stride_row: usize,
            dst_stride_col: usize,
            params: *const Qb4wMinmaxParams,
        );
        fn xnnblob_qp8_f32_qb4w_gemm_minmax_ukernel_1x8c16s2__aarch64_neondot(
            m: usize,
            n: usize,
            k: usize,
            lhs: *const c_void,
            rhs: *const c_void,
            dst: *mut f32,
            dst_stride_row: usize,
            dst_stride_col: usize,
            params: *const Qb4wMinmaxParams,
        );
        // KleidiAI 1.8.0 (kai/ukernels/matmul/matmul_clamp_f32_qai8dxp_qsi4c32p/).
        fn kai_run_matmul_clamp_f32_qai8dxp4x8_qsi4c32p4x8_16x4x32_neon_i8mm(
            m: usize,
            n: usize,
            k: usize,
            bl: usize,
            lhs: *const c_void,
            rhs: *const c_void,
            dst: *mut f32,
            dst_stride_row: usize,
            dst_stride_col: usize,
            min: f32,
            max: f32,
        );
        fn kai_run_matmul_clamp_f32_qai8dxp1x8_qsi4c32p4x8_1x4x32_neon_dotprod(
            m: usize,
            n: usize,
            k: usize,
            bl: usize,
            lhs: *const c_void,
            rhs: *const c_void,
            dst: *mut f32,
            dst_stride_row: usize,
            dst_stride_col: usize,
            min: f32,
            max: f32,
        );
    }

    /// Declares XNNPACK dqgemm microkernels (`xnn_dqgemm_ukernel_fn`'s signature).
    macro_rules! qd8_kernels {
        ($($name:ident),* $(,)?) => {
            unsafe extern "C" {
                $(fn $name(
                    mr: usize,
                    nc: usize,
                    kc: usize,
                    a: *const i8,
                    a_stride: usize,
                    w: *const c_void,
                    c: *mut f32,
                    cm_stride: usize,
                    cn_stride: usize,
                    params: *const Qb4wMinmaxParams,
                    quantization: *const Qd8QuantizationParams,
                );)*
            }
        };
    }

    // sys/xnnpack-sys/kernels/aarch64/qd8-f32-qb4w-gemm.c, and XNNPACK's kernels they replace
    // (src/qd8-f32-qb4w-gemm/gen/), all built into XNNPACK.
    qd8_kernels!(
        xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot,
        xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16__neon_mlal,
        xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_1x16__neon_mlal,
        xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot,
        xnn_qd8_f32_qb4w_gemm_minmax_ukernel_6x16__neon_mlal_lane,
        xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x16__neon_mlal_lane,
    );

    /// xorshift32: the same operands at every run.
    struct Rng(u32);

    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 17;
            self.0 ^= self.0 << 5;
            self.0
        }
        fn below(&mut self, n: u32) -> u32 {
            self.next() % n
        }
        /// In [lo, lo + span), in steps of span / 1000.
        fn float(&mut self, lo: f32, span: f32) -> f32 {
            lo + span * self.below(1000) as f32 / 1000.0
        }
    }

    /// Weights in KleidiAI's qsi4c32p4x8 layout: per 4 columns, per block, bl/32 chunks of 64
    /// bytes and 4 bf16 scales; then 4 f32 column sums and 4 f32 biases.
    fn weights(rng: &mut Rng, n: usize, k: usize, bl: usize) -> Vec<u8> {
        let mut w = Vec::new();
        for _ in 0..n.div_ceil(4) {
            for _ in 0..k / bl {
                w.extend((0..bl / 32 * 64).map(|_| rng.next() as u8));
                for _ in 0..4 {
                    let scale = rng.float(0.001, 0.01);
                    w.extend(((scale.to_bits() >> 16) as u16).to_le_bytes());
                }
            }
            for _ in 0..8 {
                w.extend(rng.float(-1.0, 2.0).to_le_bytes());
            }
        }
        w
    }

    /// Activations in KleidiAI's qai8dxp layout with `mr` rows a group: the groups' int8 values,
    /// then per row an int32 offset, then per row an f32 scale.
    fn activations(rng: &mut Rng, rows: usize, mr: usize, k: usize) -> Vec<u8> {
        let mut a = Vec::new();
        for _ in 0..rows.div_ceil(mr) {
            a.extend((0..mr * k).map(|_| rng.next() as u8));
            for _ in 0..mr {
                a.extend((rng.below(256) as i32 - 128).to_le_bytes());
            }
            for _ in 0..mr {
                a.extend(rng.float(0.001, 0.1).to_le_bytes());
            }
        }
        a
    }

    /// A NaN no kernel computes here: what every output starts as.
    const SENTINEL: u32 = 0x7fc0_dead;

    struct Case {
        m: usize,
        n: usize,
        k: usize,
        bl: usize,
        clamp: (f32, f32),
    }

    /// Runs both kernels on one case; returns their outputs, each with a spare column per row
    /// and a spare row, which must keep the sentinel.
    fn both(
        ours: Kernel,
        theirs: KaiKernel,
        mr: usize,
        case: &Case,
        rng: &mut Rng,
    ) -> [Vec<u32>; 2] {
        let Case { m, n, k, bl, clamp } = *case;
        let w = weights(rng, n, k, bl);
        let a = activations(rng, m, mr, k);
        let stride = n + 1;
        let sentinel = f32::from_bits(SENTINEL);
        let params = Qb4wMinmaxParams {
            min: clamp.0,
            max: clamp.1,
            blocksize: bl,
        };
        let mut outs = [
            vec![sentinel; (m + 1) * stride],
            vec![sentinel; (m + 1) * stride],
        ];
        // SAFETY: the operands are laid out for m x n x k with blocks of bl (k % bl == 0, bl %
        // 32 == 0), the outputs hold m rows of `stride` floats, and this CPU has the kernels'
        // instructions (checked by the caller).
        unsafe {
            ours(
                m,
                n,
                k,
                a.as_ptr().cast(),
                w.as_ptr().cast(),
                outs[0].as_mut_ptr(),
                stride * 4,
                4,
                &params,
            );
            theirs(
                m,
                n,
                k,
                bl,
                a.as_ptr().cast(),
                w.as_ptr().cast(),
                outs[1].as_mut_ptr(),
                stride * 4,
                4,
                clamp.0,
                clamp.1,
            );
        }
        outs.map(|o| o.into_iter().map(f32::to_bits).collect())
    }

    fn cases(rows: &[usize]) -> Vec<Case> {
        let mut all = Vec::new();
        for &m in rows {
            for n in [1, 3, 4, 5, 7, 8, 9, 12, 17] {
                for (k, bl) in [(32, 32), (64, 32), (96, 32), (128, 64), (256, 128)] {
                    for clamp in [(f32::NEG_INFINITY, f32::INFINITY), (-0.5, 0.5)] {
                        all.push(Case { m, n, k, bl, clamp });
                    }
                }
            }
        }
        all
    }

    fn check(name: &str, ours: Kernel, theirs: KaiKernel, mr: usize, rows: &[usize]) {
        let mut rng = Rng(0x9e37_79b9);
        let mut compared = 0;
        for case in cases(rows) {
            let [got, want] = both(ours, theirs, mr, &case, &mut rng);
            let differ = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                differ.is_none(),
                "{name}: m {} n {} k {} bl {} clamp {:?}: output {} is {:#x}, KleidiAI's {:#x}",
                case.m,
                case.n,
                case.k,
                case.bl,
                case.clamp,
                differ.unwrap(),
                got[differ.unwrap()],
                want[differ.unwrap()]
            );
            assert!(
                (0..case.m).all(|r| got[r * (case.n + 1)..][..case.n]
                    .iter()
                    .all(|&b| b != SENTINEL)),
                "{name}: m {} n {}: left an output unwritten",
                case.m,
                case.n
            );
            assert!(
                got[case.m * (case.n + 1)..].iter().all(|&b| b == SENTINEL)
                    && (0..case.m).all(|r| got[r * (case.n + 1) + case.n] == SENTINEL),
                "{name}: m {} n {}: wrote outside its m x n",
                case.m,
                case.n
            );
            compared += 1;
        }
        assert!(compared > 0);
    }

    #[test]
    fn the_prompt_kernel_gives_kleidiais_outputs_bit_for_bit() {
        if !std::arch::is_aarch64_feature_detected!("i8mm") {
            eprintln!("NOTE: this CPU has no i8mm, where XNNPACK never runs the kernel; not run");
            return;
        }
        check(
            "8x4 i8mm",
            xnnblob_qp8_f32_qb4w_gemm_minmax_ukernel_8x4c16s2__neoni8mm,
            kai_run_matmul_clamp_f32_qai8dxp4x8_qsi4c32p4x8_16x4x32_neon_i8mm,
            4,
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24],
        );
    }

    #[test]
    fn the_one_row_kernel_gives_kleidiais_outputs_bit_for_bit() {
        if !std::arch::is_aarch64_feature_detected!("dotprod") {
            eprintln!(
                "NOTE: this CPU has no dot product, where XNNPACK never runs the kernel; not run"
            );
            return;
        }
        check(
            "1x8 dot product",
            xnnblob_qp8_f32_qb4w_gemm_minmax_ukernel_1x8c16s2__aarch64_neondot,
            kai_run_matmul_clamp_f32_qai8dxp1x8_qsi4c32p4x8_1x4x32_neon_dotprod,
            1,
            &[1, 2, 3],
        );
    }

    /// Weights in XNNPACK's 16-column qb4w packings (c4 and kr 1 differ only in which nibble of
    /// the block's bytes is which value): per 16 columns 16 f32 k-sums; per block, 8 bytes a
    /// value of k, then 16 bf16 scales; then 16 f32 biases.
    fn weights_16(rng: &mut Rng, n: usize, k: usize, bl: usize) -> Vec<u8> {
        let mut w = Vec::new();
        for _ in 0..n.div_ceil(16) {
            for _ in 0..16 {
                w.extend(rng.float(-100.0, 200.0).to_le_bytes());
            }
            for _ in 0..k / bl {
                w.extend((0..bl * 8).map(|_| rng.next() as u8));
                for _ in 0..16 {
                    let scale = rng.float(0.0001, 0.001);
                    w.extend(((scale.to_bits() >> 16) as u16).to_le_bytes());
                }
            }
            for _ in 0..16 {
                w.extend(rng.float(-1.0, 2.0).to_le_bytes());
            }
        }
        w
    }

    type Qd8Kernel = unsafe extern "C" fn(
        usize,
        usize,
        usize,
        *const i8,
        usize,
        *const c_void,
        *mut f32,
        usize,
        usize,
        *const Qb4wMinmaxParams,
        *const Qd8QuantizationParams,
    );

    /// Compares two kernels on 1 to `rows` rows.
    fn check_qd8(name: &str, ours: Qd8Kernel, theirs: Qd8Kernel, rows: usize) {
        let mut rng = Rng(0x85eb_ca6b);
        let mut compared = 0;
        for mr in 1..=rows {
            for n in [1, 4, 7, 8, 9, 15, 16, 17, 24, 31, 32, 40] {
                for (k, bl) in [
                    (32, 32),
                    (64, 32),
                    (96, 32),
                    (128, 64),
                    (256, 128),
                    (64, 64),
                ] {
                    for clamp in [(f32::NEG_INFINITY, f32::INFINITY), (-0.5, 0.5)] {
                        let w = weights_16(&mut rng, n, k, bl);
                        let a: Vec<i8> = (0..4 * k).map(|_| rng.next() as i8).collect();
                        // XNNPACK pads the parameters past the batch with copies of the last row's.
                        let mut quantization = [Qd8QuantizationParams {
                            zero_point: 0,
                            scale: 0.0,
                        }; 20];
                        for q in quantization.iter_mut().take(mr) {
                            *q = Qd8QuantizationParams {
                                zero_point: rng.below(256) as i32 - 128,
                                scale: rng.float(0.001, 0.1),
                            };
                        }
                        let last = quantization[mr - 1];
                        quantization[mr..].fill(last);
                        let params = Qb4wMinmaxParams {
                            min: clamp.0,
                            max: clamp.1,
                            blocksize: bl,
                        };
                        let stride = n.div_ceil(16) * 16 + 3;
                        let sentinel = f32::from_bits(SENTINEL);
                        let mut outs = [
                            vec![sentinel; (mr + 1) * stride],
                            vec![sentinel; (mr + 1) * stride],
                        ];
                        for (out, kernel) in outs.iter_mut().zip([ours, theirs]) {
                            // SAFETY: the weights are packed for n columns of k values in blocks of
                            // bl, the activations hold 4 rows of k, the quantization parameters
                            // 20 rows, the output mr rows of `stride` floats; this CPU has the dot
                            // product where the kernels use it (checked by the caller).
                            unsafe {
                                kernel(
                                    mr,
                                    n,
                                    k,
                                    a.as_ptr(),
                                    k,
                                    w.as_ptr().cast(),
                                    out.as_mut_ptr(),
                                    stride * 4,
                                    64,
                                    &params,
                                    quantization.as_ptr(),
                                );
                            }
                        }
                        let [got, want] =
                            outs.map(|o| o.into_iter().map(f32::to_bits).collect::<Vec<_>>());
                        let differ = got.iter().zip(&want).position(|(g, w)| g != w);
                        assert!(
                            differ.is_none(),
                            "{name}: mr {mr} n {n} k {k} bl {bl} clamp {clamp:?}: output {} is {:#x}, XNNPACK's {:#x}",
                            differ.unwrap(),
                            got[differ.unwrap()],
                            want[differ.unwrap()]
                        );
                        assert!(
                            (0..mr).all(|r| got[r * stride..][..n].iter().all(|&b| b != SENTINEL))
                                && (0..mr).all(|r| got[r * stride + n..][..stride - n]
                                    .iter()
                                    .all(|&b| b == SENTINEL))
                                && got[mr * stride..].iter().all(|&b| b == SENTINEL),
                            "{name}: mr {mr} n {n}: wrote outside its m x n, or left an output unwritten"
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert_eq!(compared, rows * 12 * 6 * 2);
    }

    #[test]
    fn the_dot_product_four_row_kernel_gives_xnnpacks_outputs_bit_for_bit() {
        if !std::arch::is_aarch64_feature_detected!("dotprod") {
            eprintln!(
                "NOTE: this CPU has no dot product, where XNNPACK never runs the kernel; not run"
            );
            return;
        }
        check_qd8(
            "4x16c4 dot product",
            xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot,
            xnn_qd8_f32_qb4w_gemm_minmax_ukernel_4x16c4__neondot,
            4,
        );
    }

    #[test]
    fn the_multiply_add_four_row_kernel_gives_xnnpacks_outputs_bit_for_bit() {
        check_qd8(
            "4x16 multiply-add",
            xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_4x16__neon_mlal,
            xnn_qd8_f32_qb4w_gemm_minmax_ukernel_6x16__neon_mlal_lane,
            4,
        );
    }

    #[test]
    fn the_multiply_add_one_row_kernel_gives_xnnpacks_outputs_bit_for_bit() {
        check_qd8(
            "1x16 multiply-add",
            xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_1x16__neon_mlal,
            xnn_qd8_f32_qb4w_gemm_minmax_ukernel_1x16__neon_mlal_lane,
            1,
        );
    }
}
