//! XNNPACK's packers that this project patched for speed give the bytes their original
//! definition gives, for every shape the patch's fast path takes and every one it does not. A
//! packed-weight cache file holds those bytes: a faster packer that packed differently would
//! make files no older launch, and no other device's launch, could share.
//!
//! The oracle is the original loop, as XNNPACK 4ea82e5 wrote it, ported line for line below;
//! the packer under test is the patched one linked into this binary (patches 0008, 0011, 0021,
//! 0038, 0039).
//! On aarch64, KleidiAI's own packer is the oracle for patch 0022's, which writes its layout.

use std::ffi::c_void;

#[repr(C)]
struct Qs8Qc4wPackingParams {
    input_zero_point: i8,
    kernel_zero_point: u8,
}

unsafe extern "C" {
    // XNNPACK's internal packer (src/xnnpack/pack.h); linked from the static library.
    fn xnn_pack_qs8_qb4w_gemm_goi_w(
        g: usize,
        nc: usize,
        kc: usize,
        nr: usize,
        kr: usize,
        sr: usize,
        bl: usize,
        k: *const u8,
        bias: *const f32,
        scale: *const u16,
        packed_weights: *mut c_void,
        extra_bytes_bl: usize,
        extra_bytes_n: usize,
        params: *const Qs8Qc4wPackingParams,
    );
}

struct Shape {
    g: usize,
    nc: usize,
    kc: usize,
    nr: usize,
    kr: usize,
    sr: usize,
    bl: usize,
    extra_bytes_bl: usize,
    extra_bytes_n: usize,
}

/// The original `xnn_pack_qs8_qb4w_gemm_goi_w`, a line-for-line port (offsets into `k` and
/// `out` for its pointer arithmetic; the float sums in its order and precision).
fn original(s: &Shape, k: &[u8], scale: &[u16], izp: i32, out: &mut [u8]) {
    let skr = s.sr * s.kr;
    let round_up = |x: usize, q: usize| x.div_ceil(q) * q;
    let num_blocks = round_up(s.kc, skr) / s.bl;
    let mut pos = 0usize;
    let mut k_base = 0usize;
    for _ in 0..s.g {
        let mut nr_block_start = 0;
        while nr_block_start < s.nc {
            let nr_block_size = (s.nc - nr_block_start).min(s.nr);
            let packed_b = pos;
            pos += 4 * s.nr;
            let mut kr_block_start = 0;
            while kr_block_start < round_up(s.kc, skr * 2) {
                for n in 0..nr_block_size {
                    let mut ksum: i32 = 0;
                    let kc_begin =
                        kr_block_start / skr * skr + ((kr_block_start + n * s.kr) & (skr - 1));
                    for j in 0..s.kr {
                        let kc_idx = kc_begin + j;
                        let k_offset = (nr_block_start + n) * s.kc + kc_idx;
                        let kh_offset = k_offset + s.kr;
                        let nibble = |at: usize| {
                            if at & 1 == 1 {
                                k[k_base + (at >> 1)] >> 4
                            } else {
                                k[k_base + (at >> 1)] & 0xF
                            }
                        };
                        let lo = if kc_idx < s.kc { nibble(k_offset) } else { 8 };
                        let hi = if kc_idx + s.kr < s.kc {
                            nibble(kh_offset)
                        } else {
                            8
                        };
                        ksum += lo as i32 + hi as i32 - 16;
                        out[pos + j] = (lo | (hi << 4)) ^ 0x88;
                    }
                    let block_index = kr_block_start / s.bl;
                    let scale_index = (nr_block_start + n) * num_blocks + block_index;
                    let at = packed_b + 4 * n;
                    let b = f32::from_le_bytes(out[at..at + 4].try_into().unwrap());
                    let sc = f32::from_bits((scale[scale_index] as u32) << 16);
                    let b = b - ksum as f32 * izp as f32 * sc;
                    out[at..at + 4].copy_from_slice(&b.to_le_bytes());
                    pos += s.kr;
                }
                if (2 * s.kr + kr_block_start).is_multiple_of(s.bl) {
                    pos += s.extra_bytes_bl;
                }
                pos += (s.nr - nr_block_size) * s.kr;
                kr_block_start += s.kr * 2;
            }
            pos += s.extra_bytes_n;
            nr_block_start += s.nr;
        }
        // As the original: a group's kernel starts nc * kc bytes (not nibbles) after the
        // last one's.
        k_base += s.nc * s.kc;
    }
}

/// A small deterministic generator (xorshift), so a failure names a reproducible case.
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn the_patched_qb4w_packer_packs_every_shape_as_the_original_does() {
    let mut bits = Bits(0x9e37_79b9_7f4a_7c15);
    let mut cases = 0;
    // kr and sr as XNNPACK's qb4w kernels use them (c4, c8, c16; sr 1 and 2), row lengths
    // that are a multiple of 2 * kr (the fast path throughout), odd, or short of it (the
    // general loop at each row's end), groups, and ragged last column blocks.
    for (kr, sr) in [
        (4usize, 1usize),
        (8, 1),
        (16, 1),
        (4, 2),
        (8, 2),
        (2, 1),
        (1, 1),
    ] {
        let skr = kr * sr;
        for nr in [sr.max(4), 8, 16] {
            for kc in [
                2 * skr,
                4 * skr,
                4 * skr - 1,
                4 * skr - kr,
                6 * skr + 3,
                32 * skr,
                64,
                96,
                256,
            ] {
                let k_rounded = kc.div_ceil(skr) * skr;
                // XNNPACK's blockwise layers have blocks of a multiple of 32 and rows of whole
                // blocks; the packer reads its scales past the row's blocks for shapes where the
                // last byte group starts past them, which no layer has.
                let in_bounds = |bl: usize| {
                    let last_group = kc.div_ceil(2 * skr) * 2 * skr - 2 * kr;
                    last_group / bl < k_rounded / bl
                };
                for bl in [2 * skr, 4 * skr, k_rounded, 32, 64]
                    .into_iter()
                    .filter(|&bl| {
                        k_rounded.is_multiple_of(bl)
                            && bl.is_multiple_of(skr)
                            && bl <= k_rounded
                            && 2 * skr <= bl
                            && in_bounds(bl)
                    })
                {
                    for (g, nc) in [(1, nr), (1, 3 * nr + 1), (2, nr - 1), (1, 1)] {
                        let shape = Shape {
                            g,
                            nc,
                            kc,
                            nr,
                            kr,
                            sr,
                            bl,
                            extra_bytes_bl: nr * 2,
                            extra_bytes_n: nr * 4,
                        };
                        check(&shape, &mut bits);
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases > 300, "{cases} cases");
}

fn check(s: &Shape, bits: &mut Bits) {
    let num_blocks = s.kc.div_ceil(s.sr * s.kr) * (s.sr * s.kr) / s.bl;
    let k: Vec<u8> = (0..s.g * s.nc * s.kc + 1)
        .map(|_| bits.next() as u8)
        .collect();
    // Positive normal bf16 scales (what patch 0007 lets through), of varied magnitude.
    let scale: Vec<u16> = (0..s.g * s.nc * num_blocks)
        .map(|_| 0x3c00 + (bits.next() % 0x0600) as u16)
        .collect();
    let izp = 1 + (bits.next() % 100) as i8;
    // Generously sized: the original's own layout arithmetic says where it stops.
    let blocks = s.nc.div_ceil(s.nr);
    let skr = s.sr * s.kr;
    let steps = s.kc.div_ceil(2 * skr) * 2 * skr / (2 * s.kr);
    let per_block = 4 * s.nr + steps * (s.nr * s.kr + s.extra_bytes_bl) + s.extra_bytes_n;
    let len = s.g * blocks * per_block + 64;
    // The bias slots hold what the caller put there first (the packer subtracts from them).
    let start: Vec<u8> = (0..len).map(|_| bits.next() as u8 & 0x3f).collect();
    let mut want = start.clone();
    original(s, &k, &scale, izp as i32, &mut want);
    let mut got = start;
    let params = Qs8Qc4wPackingParams {
        input_zero_point: izp,
        kernel_zero_point: 8,
    };
    // SAFETY: the buffers are as large as the original's layout reaches for this shape (it
    // wrote `want` within them), the shape meets the packer's asserted constraints, and the
    // bias is null as it requires.
    unsafe {
        xnn_pack_qs8_qb4w_gemm_goi_w(
            s.g,
            s.nc,
            s.kc,
            s.nr,
            s.kr,
            s.sr,
            s.bl,
            k.as_ptr(),
            std::ptr::null(),
            scale.as_ptr(),
            got.as_mut_ptr().cast(),
            s.extra_bytes_bl,
            s.extra_bytes_n,
            &params,
        )
    };
    assert!(
        got == want,
        "g {} nc {} kc {} nr {} kr {} sr {} bl {}: the packed bytes differ from the original's",
        s.g,
        s.nc,
        s.kc,
        s.nr,
        s.kr,
        s.sr,
        s.bl
    );
}

#[repr(C)]
struct Qs8PackingParams {
    input_zero_point: i8,
}

unsafe extern "C" {
    // XNNPACK's internal packers (src/xnnpack/pack.h); linked from the static library.
    fn xnn_pack_qs8_gemm_goi_w(
        g: usize,
        nc: usize,
        kc: usize,
        nr: usize,
        kr: usize,
        sr: usize,
        k: *const i8,
        bias: *const i32,
        scale: *const f32,
        packed_weights: *mut c_void,
        extra_bytes: usize,
        params: *const Qs8PackingParams,
    );
    fn xnn_pack_qs8_to_qu8_gemm_goi_w(
        g: usize,
        nc: usize,
        kc: usize,
        nr: usize,
        kr: usize,
        sr: usize,
        k: *const i8,
        bias: *const i32,
        scale: *const f32,
        packed_weights: *mut c_void,
        extra_bytes: usize,
        params: *const Qs8PackingParams,
    );
    fn xnn_pack_qs8_to_qu8_conv_goki_w(
        g: usize,
        nc: usize,
        ks: usize,
        kc: usize,
        nr: usize,
        kr: usize,
        sr: usize,
        k: *const i8,
        bias: *const i32,
        scale: *const f32,
        packed_weights: *mut c_void,
        extra_bytes: usize,
        params: *const Qs8PackingParams,
    );
    fn xnn_pack_qs8_conv_goki_w(
        g: usize,
        nc: usize,
        ks: usize,
        kc: usize,
        nr: usize,
        kr: usize,
        sr: usize,
        k: *const i8,
        bias: *const i32,
        scale: *const f32,
        packed_weights: *mut c_void,
        extra_bytes: usize,
        params: *const Qs8PackingParams,
    );
}

/// A filter's shape: `g` groups of `nc` rows of `ks` kernel positions of `kc` values.
#[derive(Debug)]
struct FilterShape {
    g: usize,
    nc: usize,
    ks: usize,
    kc: usize,
    nr: usize,
    kr: usize,
    sr: usize,
    extra_bytes: usize,
}

/// The original `xnn_pack_qs8_conv_goki_w`, a line-for-line port (offsets into `k`, `bias` and
/// `out` for its pointer arithmetic; its unsigned bias arithmetic as wrapping `u32`). The
/// original `xnn_pack_qs8_gemm_goi_w` is the same loop with one kernel position (`ks` 1), and
/// the `_to_qu8` forms of both the same with `izp` the input zero point plus 128 (their
/// kernels read the input as uint8).
fn original_qs8(s: &FilterShape, k: &[i8], bias: Option<&[i32]>, izp: u32, out: &mut [u8]) {
    let skr = s.sr * s.kr;
    let round_up = |x: usize, q: usize| x.div_ceil(q) * q;
    let (mut pos, mut k_base, mut b_base) = (0usize, 0usize, 0usize);
    let load = |out: &[u8], at: usize| i32::from_le_bytes(out[at..at + 4].try_into().unwrap());
    for _ in 0..s.g {
        let mut nr_block_start = 0;
        while nr_block_start < s.nc {
            let nr_block_size = (s.nc - nr_block_start).min(s.nr);
            let packed_b = pos;
            for n in 0..nr_block_size {
                let v = bias.map_or(0, |b| b[b_base + nr_block_start + n]);
                out[packed_b + 4 * n..packed_b + 4 * n + 4].copy_from_slice(&v.to_le_bytes());
            }
            pos += 4 * s.nr;
            for ki in 0..s.ks {
                let mut kr_block_start = 0;
                while kr_block_start < round_up(s.kc, skr) {
                    for n in 0..nr_block_size {
                        let kc_begin =
                            kr_block_start / skr * skr + ((kr_block_start + n * s.kr) & (skr - 1));
                        let kc_end = s.kc.min(kc_begin + s.kr);
                        if kc_begin < kc_end {
                            let from =
                                k_base + ((nr_block_start + n) * s.ks + ki) * s.kc + kc_begin;
                            let mut ksum: i32 = 0;
                            for j in 0..kc_end - kc_begin {
                                ksum += k[from + j] as i32;
                                out[pos + j] = k[from + j] as u8;
                            }
                            let at = packed_b + 4 * n;
                            let b = (load(out, at) as u32)
                                .wrapping_sub((ksum as u32).wrapping_mul(izp));
                            out[at..at + 4].copy_from_slice(&b.to_le_bytes());
                        }
                        pos += s.kr;
                    }
                    pos += (s.nr - nr_block_size) * s.kr;
                    kr_block_start += s.kr;
                }
            }
            pos += s.extra_bytes;
            nr_block_start += s.nr;
        }
        k_base += s.ks * s.kc * s.nc;
        if bias.is_some() {
            b_base += s.nc;
        }
    }
}

#[test]
fn the_patched_qs8_packers_pack_every_shape_as_the_original_does() {
    let mut bits = Bits(0x2545_f491_4f6c_dd1d);
    let mut cases = 0;
    // kr and sr as XNNPACK's qs8 kernels use them (c1 to c16 with sr 1: patch 0038's path; c2s4,
    // c4s2, c8s2 and the like: the original loop), rows shorter than a group, ending inside one
    // or on its end, rows longer than the fast path sums between flushes (1,024 bytes), groups,
    // ragged last column blocks, with and without a bias, and the per-channel scales' room
    // after each column block.
    for (kr, sr) in [
        (1usize, 1usize),
        (2, 1),
        (4, 1),
        (8, 1),
        (16, 1),
        (2, 4),
        (4, 2),
        (8, 2),
        (1, 4),
    ] {
        let skr = kr * sr;
        for nr in [sr.max(4), 8, 16, 64] {
            for kc in [
                1,
                3,
                kr,
                kr + 1,
                3 * skr - 1,
                4 * skr,
                37,
                64,
                100,
                1031,
                2056,
            ] {
                // One kernel position or a 3x3 window; the long rows with fewer companions.
                let long = kc > 1024;
                for ks in [1usize, 9] {
                    for (g, nc) in [(1, nr), (1, 3 * nr + 1), (2, nr - 1), (1, 1)] {
                        if long && (nr > 16 || nc > nr) {
                            continue;
                        }
                        for with_bias in [true, false] {
                            let shape = FilterShape {
                                g,
                                nc,
                                ks,
                                kc,
                                nr,
                                kr,
                                sr,
                                extra_bytes: if with_bias { 4 * nr } else { 0 },
                            };
                            check_qs8(&shape, with_bias, &mut bits);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 1500, "{cases} cases");
}

fn check_qs8(s: &FilterShape, with_bias: bool, bits: &mut Bits) {
    // Random bytes, or every byte the most or the least an int8 holds (the largest sums the
    // fast path's 16-bit lanes add up between flushes, rows of over 1,024 bytes among them).
    let fill = bits.next() % 4;
    let k: Vec<i8> = (0..s.g * s.nc * s.ks * s.kc)
        .map(|_| match fill {
            0 => i8::MAX,
            1 => i8::MIN,
            _ => bits.next() as i8,
        })
        .collect();
    let bias: Vec<i32> = (0..s.g * s.nc).map(|_| bits.next() as i32).collect();
    let bias = with_bias.then_some(bias.as_slice());
    // Any input zero point, negative ones among them (the packers widen it with its sign).
    let izp = bits.next() as i8;
    let skr = s.sr * s.kr;
    let per_block = 4 * s.nr + s.ks * s.kc.div_ceil(skr) * skr * s.nr + s.extra_bytes;
    let len = s.g * s.nc.div_ceil(s.nr) * per_block + 64;
    // What the caller's buffer held before: the packers write over some of it and leave the
    // rest (the padding of ragged blocks, the scales' room), which must stay as it was.
    let start: Vec<u8> = (0..len).map(|_| bits.next() as u8).collect();
    let params = Qs8PackingParams {
        input_zero_point: izp,
    };
    let bias_ptr = bias.map_or(std::ptr::null(), |b| b.as_ptr());
    type Conv = unsafe extern "C" fn(
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        *const i8,
        *const i32,
        *const f32,
        *mut c_void,
        usize,
        *const Qs8PackingParams,
    );
    type Gemm = unsafe extern "C" fn(
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        *const i8,
        *const i32,
        *const f32,
        *mut c_void,
        usize,
        *const Qs8PackingParams,
    );
    let convs: [(&str, Conv, u32); 2] = [
        ("xnn_pack_qs8_conv_goki_w", xnn_pack_qs8_conv_goki_w, 0),
        (
            "xnn_pack_qs8_to_qu8_conv_goki_w",
            xnn_pack_qs8_to_qu8_conv_goki_w,
            128,
        ),
    ];
    let gemms: [(&str, Gemm, u32); 2] = [
        ("xnn_pack_qs8_gemm_goi_w", xnn_pack_qs8_gemm_goi_w, 0),
        (
            "xnn_pack_qs8_to_qu8_gemm_goi_w",
            xnn_pack_qs8_to_qu8_gemm_goi_w,
            128,
        ),
    ];
    let mut packed: Vec<(&str, u32, Vec<u8>)> = Vec::new();
    for (name, pack, shift) in convs {
        let mut got = start.clone();
        // SAFETY: the buffer is as large as the original's layout reaches for this shape (the
        // oracle below writes within it), `k` and the bias hold every row the shape names, and
        // the shape meets the packers' asserted constraints (nr >= sr; kr and sr powers of two).
        unsafe {
            pack(
                s.g,
                s.nc,
                s.ks,
                s.kc,
                s.nr,
                s.kr,
                s.sr,
                k.as_ptr(),
                bias_ptr,
                std::ptr::null(),
                got.as_mut_ptr().cast(),
                s.extra_bytes,
                &params,
            )
        };
        packed.push((name, shift, got));
    }
    for (name, pack, shift) in gemms.into_iter().filter(|_| s.ks == 1) {
        let mut got = start.clone();
        // SAFETY: as above, for the same filter read as one kernel position.
        unsafe {
            pack(
                s.g,
                s.nc,
                s.kc,
                s.nr,
                s.kr,
                s.sr,
                k.as_ptr(),
                bias_ptr,
                std::ptr::null(),
                got.as_mut_ptr().cast(),
                s.extra_bytes,
                &params,
            )
        };
        packed.push((name, shift, got));
    }
    for (packer, shift, got) in packed {
        let mut want = start.clone();
        original_qs8(
            s,
            &k,
            bias,
            (izp as i32 as u32).wrapping_add(shift),
            &mut want,
        );
        assert!(
            got == want,
            "{packer} {s:?} izp {izp} bias {with_bias}: the packed bytes differ from the original's"
        );
    }
}

unsafe extern "C" {
    // XNNPACK's internal packer (src/xnnpack/pack.h); linked from the static library.
    fn xnn_pack_f32_conv_goki_w(
        g: usize,
        nc: usize,
        ks: usize,
        kc: usize,
        nr: usize,
        kr: usize,
        sr: usize,
        k: *const f32,
        bias: *const f32,
        scale: *const c_void,
        packed_weights: *mut f32,
        extra_bytes: usize,
        params: *const c_void,
    );
}

/// The original `xnn_pack_f32_conv_goki_w`, a line-for-line port (offsets into `k`, `bias` and
/// `out`, in floats; `extra_bytes` a multiple of 4, as XNNPACK's callers pass it). Floats are
/// moved as their bits, as its `std::copy_n` moves them.
fn original_f32_conv(s: &FilterShape, k: &[u32], bias: Option<&[u32]>, out: &mut [u32]) {
    let skr = s.sr * s.kr;
    let round_up = |x: usize, q: usize| x.div_ceil(q) * q;
    let (mut pos, mut k_base, mut b_base) = (0usize, 0usize, 0usize);
    for _ in 0..s.g {
        let mut nr_block_start = 0;
        while nr_block_start < s.nc {
            let nr_block_size = (s.nc - nr_block_start).min(s.nr);
            if let Some(b) = bias {
                out[pos..pos + nr_block_size]
                    .copy_from_slice(&b[b_base + nr_block_start..][..nr_block_size]);
            }
            pos += s.nr;
            for ki in 0..s.ks {
                let mut kr_block_start = 0;
                while kr_block_start < round_up(s.kc, skr) {
                    for n in 0..nr_block_size {
                        let kc_begin =
                            kr_block_start / skr * skr + ((kr_block_start + n * s.kr) & (skr - 1));
                        let kc_end = s.kc.min(kc_begin + s.kr);
                        if kc_begin < kc_end {
                            let from =
                                k_base + ((nr_block_start + n) * s.ks + ki) * s.kc + kc_begin;
                            out[pos..pos + kc_end - kc_begin]
                                .copy_from_slice(&k[from..from + kc_end - kc_begin]);
                        }
                        pos += s.kr;
                    }
                    pos += (s.nr - nr_block_size) * s.kr;
                    kr_block_start += s.kr;
                }
            }
            pos += s.extra_bytes / 4;
            nr_block_start += s.nr;
        }
        k_base += s.ks * s.kc * s.nc;
        if bias.is_some() {
            b_base += s.nc;
        }
    }
}

#[test]
fn the_patched_f32_convolution_packer_packs_every_shape_as_the_original_does() {
    let mut bits = Bits(0x6a09_e667_f3bc_c908);
    let mut cases = 0;
    // kr 1 with sr 1 (patch 0039's path: every x86 f32 kernel) and the others the original
    // loop keeps (Arm's s4 kernels, c2, c4), kernel windows of 1 to 3x3, ragged blocks, with
    // and without a bias and room after each column block.
    for (kr, sr) in [(1usize, 1usize), (1, 4), (2, 1), (4, 1), (2, 2)] {
        for nr in [sr.max(4), 8, 16, 32] {
            for kc in [1, 3, 4, 17, 64, 129] {
                for ks in [1usize, 4, 9] {
                    for (g, nc) in [(1, nr), (1, 3 * nr + 1), (2, nr - 1), (1, 1)] {
                        for with_bias in [true, false] {
                            let s = FilterShape {
                                g,
                                nc,
                                ks,
                                kc,
                                nr,
                                kr,
                                sr,
                                extra_bytes: if with_bias { 4 * nr } else { 0 },
                            };
                            check_f32_conv(&s, with_bias, &mut bits);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 1000, "{cases} cases");
}

fn check_f32_conv(s: &FilterShape, with_bias: bool, bits: &mut Bits) {
    // Any bit patterns: the packer moves floats, it does not compute with them.
    let k: Vec<u32> = (0..s.g * s.nc * s.ks * s.kc)
        .map(|_| bits.next() as u32)
        .collect();
    let bias: Vec<u32> = (0..s.g * s.nc).map(|_| bits.next() as u32).collect();
    let bias = with_bias.then_some(bias.as_slice());
    let skr = s.sr * s.kr;
    let per_block = s.nr + s.ks * s.kc.div_ceil(skr) * skr * s.nr + s.extra_bytes / 4;
    let len = s.g * s.nc.div_ceil(s.nr) * per_block + 16;
    // What the caller's buffer held before: slots the packer skips must stay as they were.
    let start: Vec<u32> = (0..len).map(|_| bits.next() as u32).collect();
    let mut want = start.clone();
    original_f32_conv(s, &k, bias, &mut want);
    let mut got = start;
    // SAFETY: the buffer is as large as the original's layout reaches for this shape (it wrote
    // `want` within it), `k` and the bias hold every row the shape names, and the shape meets
    // the packer's asserted constraints (nr >= sr; kr and sr powers of two).
    unsafe {
        xnn_pack_f32_conv_goki_w(
            s.g,
            s.nc,
            s.ks,
            s.kc,
            s.nr,
            s.kr,
            s.sr,
            k.as_ptr().cast(),
            bias.map_or(std::ptr::null(), |b| b.as_ptr().cast()),
            std::ptr::null(),
            got.as_mut_ptr().cast(),
            s.extra_bytes,
            std::ptr::null(),
        )
    };
    assert!(
        got == want,
        "xnn_pack_f32_conv_goki_w {s:?} bias {with_bias}: the packed floats differ from the original's"
    );
}

/// KleidiAI's qsi4c32p packer (aarch64 glibc builds link KleidiAI), the oracle for patch 0022's.
#[cfg(all(target_arch = "aarch64", target_env = "gnu"))]
mod kleidiai_layout {
    use super::Bits;
    use std::ffi::c_void;

    /// `enum kai_datatype`'s bf16.
    const KAI_DT_BF16: u32 = 0x0213;

    #[repr(C)]
    struct KaiParams {
        lhs_zero_point: i8,
        rhs_zero_point: u8,
        scale_dt: u32,
    }

    unsafe extern "C" {
        // KleidiAI 1.8.0 (kai/ukernels/matmul/pack/kai_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0.h).
        fn kai_get_rhs_packed_size_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(
            n: usize,
            k: usize,
            nr: usize,
            kr: usize,
            sr: usize,
            bl: usize,
            scale_dt: u32,
        ) -> usize;
        fn kai_run_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(
            num_groups: usize,
            n: usize,
            k: usize,
            nr: usize,
            kr: usize,
            sr: usize,
            bl: usize,
            rhs: *const u8,
            rhs_stride: usize,
            bias: *const f32,
            scale: *const c_void,
            scale_stride: usize,
            rhs_packed: *mut c_void,
            extra_bytes: usize,
            params: *const KaiParams,
        );
        // XNNPACK's patched packer (src/xnnpack/pack.h, patch 0022).
        fn xnn_pack_kai_qb4_weights_kr8(
            n: usize,
            k: usize,
            nr: usize,
            bl: usize,
            rhs: *const u8,
            bias: *const f32,
            scale: *const u16,
            packed: *mut c_void,
        ) -> bool;
    }

    /// Packs with both; returns (KleidiAI's bytes, ours), or None where ours declines.
    fn both(
        n: usize,
        k: usize,
        nr: usize,
        bl: usize,
        bias: bool,
        bits: &mut Bits,
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        let blocks = k / bl;
        let rhs: Vec<u8> = (0..n * k / 2).map(|_| bits.next() as u8).collect();
        // Positive normal bf16 scales (what patch 0007 lets through), of varied magnitude.
        let scale: Vec<u16> = (0..n * blocks)
            .map(|_| 0x3c00 + (bits.next() % 0x0600) as u16)
            .collect();
        let bias: Option<Vec<f32>> = bias.then(|| {
            (0..n)
                .map(|_| (bits.next() % 2001) as f32 / 7.0 - 140.0)
                .collect()
        });
        let bias_ptr = bias.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
        // SAFETY: a size query of valid arguments (nr a multiple of 4, bl of 32 and of kr).
        let size = unsafe {
            kai_get_rhs_packed_size_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(
                n,
                k,
                nr,
                16,
                2,
                bl,
                KAI_DT_BF16,
            )
        };
        // Filled with junk first, so a byte either packer leaves unwritten shows.
        let junk: Vec<u8> = (0..size).map(|_| bits.next() as u8).collect();
        let mut want = junk.clone();
        let mut got = junk;
        let params = KaiParams {
            lhs_zero_point: 1,
            rhs_zero_point: 8,
            scale_dt: KAI_DT_BF16,
        };
        // SAFETY: rhs is n rows of k / 2 bytes, scale n rows of `blocks` bf16 values, bias null
        // or n floats, and `want` the packed size KleidiAI states for this shape.
        unsafe {
            kai_run_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(
                1,
                n,
                k,
                nr,
                16,
                2,
                bl,
                rhs.as_ptr(),
                k / 2,
                bias_ptr,
                scale.as_ptr().cast(),
                blocks * 2,
                want.as_mut_ptr().cast(),
                0,
                &params,
            )
        };
        // SAFETY: as above; the patched packer writes the same layout, within the same size.
        let packed = unsafe {
            xnn_pack_kai_qb4_weights_kr8(
                n,
                k,
                nr,
                bl,
                rhs.as_ptr(),
                bias_ptr,
                scale.as_ptr(),
                got.as_mut_ptr().cast(),
            )
        };
        packed.then_some((want, got))
    }

    #[test]
    fn the_patched_kleidiai_layout_packer_packs_as_kleidiai_does() {
        let mut bits = Bits(0x2545_f491_4f6c_dd1d);
        let mut cases = 0;
        for nr in [4usize, 8, 16] {
            for n in [1, 3, nr, nr + 1, 3 * nr + 2] {
                for k in [32usize, 64, 96, 256, 1024] {
                    for bl in [32usize, 64, 128, k] {
                        if !k.is_multiple_of(bl) {
                            continue;
                        }
                        for bias in [false, true] {
                            let (want, got) = both(n, k, nr, bl, bias, &mut bits)
                                .unwrap_or_else(|| panic!("n {n} k {k} nr {nr} bl {bl}: declined"));
                            let first = want.iter().zip(&got).position(|(w, g)| w != g);
                            assert!(
                                got == want,
                                "n {n} k {k} nr {nr} bl {bl} bias {bias}: the packed bytes differ from \
                                 KleidiAI's, first at byte {first:?} of {}",
                                want.len()
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert!(cases > 200, "{cases} cases");
    }

    #[test]
    fn shapes_the_patched_packer_does_not_cover_are_left_to_kleidiai() {
        // k not a whole number of blocks, and nr not a multiple of 4: declined, nothing written.
        for (n, k, nr, bl) in [(5, 48, 4, 32), (4, 64, 6, 32), (4, 64, 4, 48)] {
            let rhs = vec![0u8; n * k / 2 + 16];
            let scale = vec![0x3f80u16; n * k.div_ceil(bl)];
            let mut packed = vec![0xA5u8; 4096];
            // SAFETY: the packer declines these shapes before reading or writing anything.
            let took = unsafe {
                xnn_pack_kai_qb4_weights_kr8(
                    n,
                    k,
                    nr,
                    bl,
                    rhs.as_ptr(),
                    std::ptr::null(),
                    scale.as_ptr(),
                    packed.as_mut_ptr().cast(),
                )
            };
            assert!(!took, "n {n} k {k} nr {nr} bl {bl} was taken");
            assert!(
                packed.iter().all(|&b| b == 0xA5),
                "n {n} k {k} nr {nr} bl {bl}: bytes written"
            );
        }
    }
}
