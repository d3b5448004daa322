//! The quantized fully connected operators: dynamically quantized (qd8) activations times
//! per-channel 8-bit, 4-bit and blockwise 4-bit weights, against plain Rust references, on this
//! CPU's kernels and again on an emulated AVX2-only CPU.

use super::*;

/// The quantization step XNNPACK's dynamic (qd8) quantization uses for a row: the row's range,
/// widened to include 0, split into 255 steps (`xnn_qd8_asymmetric_quantization_params`).
fn qd8_step(row: &[f32]) -> f32 {
    let lo = row.iter().copied().fold(0f32, f32::min);
    let hi = row.iter().copied().fold(0f32, f32::max);
    (hi - lo) / 255.0
}

/// Checks a dynamically quantized fully connected result against the fp32 reference of the
/// dequantized weights `w` (outputs x inputs) and `bias`, unclamped, for every row of `x`.
///
/// Tolerance: the weights are exact (the reference uses exactly the dequantized values XNNPACK
/// computes with) and the integer accumulation is exact, so the only error is quantizing each
/// activation row to int8. Each activation is rounded to the nearest of 256 levels `step`
/// apart (≤ step / 2), and the zero point is nudged to an integer, which can push the
/// extremes of the row by up to another step / 2 before clamping; so every activation is off
/// by at most one `step`, and output `o` of row `b` by at most `step_b · Σ_k |w[o, k]|`. The
/// extra 1e-4 covers fp32 rounding of the scales and the sums.
fn assert_within_qd8_bound(
    actual: &[f32],
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    inputs: usize,
    outputs: usize,
) {
    let expected = reference_fully_connected(
        x,
        w,
        Some(bias),
        x.len() / inputs,
        inputs,
        outputs,
        (f32::NEG_INFINITY, f32::INFINITY),
    );
    let mut worst_bound = 0f32;
    for (b, row) in x.chunks(inputs).enumerate() {
        let step = qd8_step(row);
        for o in 0..outputs {
            let l1: f32 = w[o * inputs..(o + 1) * inputs]
                .iter()
                .map(|v| v.abs())
                .sum();
            let bound = step * l1 + 1e-4;
            worst_bound = worst_bound.max(bound);
            let (a, e) = (actual[b * outputs + o], expected[b * outputs + o]);
            assert!(
                (a - e).abs() <= bound,
                "row {b} output {o}: {a} vs reference {e}, bound {bound}"
            );
        }
    }
    // The bound is tight enough to catch a wrong scale, zero point or layout: it is a small
    // fraction of the outputs' spread.
    let spread = expected.iter().map(|v| v.abs()).fold(0f32, f32::max);
    assert!(
        worst_bound < 0.1 * spread,
        "bound {worst_bound} vs spread {spread}"
    );
}

/// Batch sizes for the quantized fully connected tests: every remainder of the widest qd8 GEMM
/// tiles (14 rows for AVX512-VNNI+GFNI qb4w, 16 for AMX), where rows past the batch alias the
/// last one. XNNPACK 4ea82e5 as released got batches 2, 3 and 15-17 wrong with its 14-row qb4w
/// kernel (sys/xnnpack-sys/patches/0001-*).
const QD8_BATCHES: std::ops::RangeInclusive<usize> = 1..=17;

/// Builds `fp32 input -> convert -> qdint8 -> fully connected (quantized filter) -> fp32`.
pub(super) fn qd8_fully_connected_graph<'data>(
    batch: usize,
    inputs: usize,
    outputs: usize,
    define_filter: impl FnOnce(&mut Subgraph<'data>) -> u32,
    bias: &'data [f32],
    flags: FullyConnectedFlags,
) -> Subgraph<'data> {
    qd8_fully_connected_graph_converted(
        batch,
        inputs,
        outputs,
        define_filter,
        bias,
        flags,
        Subgraph::define_convert,
    )
}

/// [`qd8_fully_connected_graph`] with the activations converted by `convert`.
fn qd8_fully_connected_graph_converted<'data>(
    batch: usize,
    inputs: usize,
    outputs: usize,
    define_filter: impl FnOnce(&mut Subgraph<'data>) -> u32,
    bias: &'data [f32],
    flags: FullyConnectedFlags,
    convert: fn(&mut Subgraph<'data>, u32, u32) -> Result<(), xnnblob::xnn::XnnError>,
) -> Subgraph<'data> {
    let mut g = Subgraph::new(2).unwrap();
    let input = g
        .define_f32_tensor(&[batch, inputs], ValueRole::Input(INPUT))
        .unwrap();
    let quantized = g
        .define_dynamically_quantized_tensor(Datatype::Qdint8, &[batch, inputs], 1)
        .unwrap();
    convert(&mut g, input, quantized).unwrap();
    let filter = define_filter(&mut g);
    let b = g
        .define_f32_tensor(&[outputs], ValueRole::static_f32(bias))
        .unwrap();
    let output = g
        .define_f32_tensor(&[batch, outputs], ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_fully_connected_with_flags(
        quantized,
        filter,
        Some(b),
        output,
        f32::NEG_INFINITY,
        f32::INFINITY,
        flags,
    )
    .unwrap();
    g
}

#[test]
fn qd8_activations_times_qc8w_weights_match_dequantized_fp32_reference() {
    for batch in QD8_BATCHES {
        eprintln!("batch {batch}: {}", kernels_line(&[Qd8Weights::Qc8w]));
        check_qd8_qc8w(batch);
    }
}

fn check_qd8_qc8w(batch: usize) {
    let (inputs, outputs) = (64, 24);
    let mut rng = SplitMix64(41);
    let x = random(&mut rng, batch * inputs, 1.0);
    let q: Vec<i8> = (0..outputs * inputs)
        .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
        .collect();
    let q = padded(q);
    let q = &q[..outputs * inputs];
    let scales = padded(
        (0..outputs)
            .map(|o| 0.002 + 0.001 * (o % 7) as f32)
            .collect(),
    );
    let scales = &scales[..outputs];
    let bias = padded(random(&mut rng, outputs, 0.3));
    let bias = &bias[..outputs];
    let w: Vec<f32> = (0..outputs * inputs)
        .map(|i| q[i] as f32 * scales[i / inputs])
        .collect();

    let g = qd8_fully_connected_graph(
        batch,
        inputs,
        outputs,
        |g| {
            g.define_channelwise_quantized_tensor(
                Datatype::Qcint8,
                &[outputs, inputs],
                ChannelwiseQuantization {
                    zero_point: 0,
                    scales,
                    channel_dim: 0,
                },
                ValueRole::static_i8(q),
            )
            .unwrap()
        },
        bias,
        FullyConnectedFlags::default(),
    );
    let actual = run(&g, &x, batch * outputs);
    assert_within_qd8_bound(&actual, &x, &w, bias, inputs, outputs);
}

/// Packs rows of 4-bit values two per byte, the even-indexed one in the low nibble, each row
/// starting on a byte (`Datatype::tensor_bytes`'s layout); the spare high nibble of an odd row
/// holds `pad`, which must be the zero point: XNNPACK's qd8 packing reads it as one more weight
/// (of value 0 only then), and its f32 x qc4w path ignores it (patches/0003-*).
pub(super) fn pack_nibble_rows(values: &[u8], row: usize, pad: u8) -> Vec<u8> {
    values
        .chunks(row)
        .flat_map(|r| {
            r.chunks(2)
                .map(move |pair| pair[0] | pair.get(1).copied().unwrap_or(pad) << 4)
        })
        .collect()
}

#[test]
fn qd8_activations_times_qc4w_weights_match_reference_with_odd_and_transposed_rows() {
    for batch in QD8_BATCHES {
        eprintln!("batch {batch}: {}", kernels_line(&[Qd8Weights::Qc4w]));
        check_qd8_qc4w(batch);
    }
}

fn check_qd8_qc4w(batch: usize) {
    // [outputs, inputs] with 16 inputs, then 15: each row ends with a spare nibble, which
    // checks the byte size, nibble order and padding `Datatype::tensor_bytes` documents. Then
    // [inputs, outputs], transposed, with even dimensions (the wrapper refuses odd ones).
    for (inputs, transposed, seed) in [(16, false, 53), (15, false, 51), (16, true, 52)] {
        let outputs = 10;
        let mut rng = SplitMix64(seed);
        let x = random(&mut rng, batch * inputs, 1.0);
        // nibbles[o * inputs + k] is the weight of input k in output o.
        let nibbles: Vec<u8> = (0..outputs * inputs)
            .map(|_| (rng.next_u64() % 16) as u8)
            .collect();
        let (dims, channel_dim, stored) = if transposed {
            let mut t = vec![0u8; inputs * outputs];
            for o in 0..outputs {
                for k in 0..inputs {
                    t[k * outputs + o] = nibbles[o * inputs + k];
                }
            }
            ([inputs, outputs], 1, pack_nibble_rows(&t, outputs, 8))
        } else {
            ([outputs, inputs], 0, pack_nibble_rows(&nibbles, inputs, 8))
        };
        assert_eq!(Some(stored.len()), Datatype::Qcint4.tensor_bytes(&dims));
        let stored_len = stored.len();
        let stored = padded(stored);
        let scales = padded((0..outputs).map(|o| 0.02 + 0.005 * o as f32).collect());
        let scales = &scales[..outputs];
        let bias = padded(random(&mut rng, outputs, 0.3));
        let bias = &bias[..outputs];
        // Zero point 8: nibble v stands for (v - 8) * scale.
        let w: Vec<f32> = (0..outputs * inputs)
            .map(|i| (nibbles[i] as f32 - 8.0) * scales[i / inputs])
            .collect();

        let g = qd8_fully_connected_graph(
            batch,
            inputs,
            outputs,
            |g| {
                g.define_channelwise_quantized_tensor(
                    Datatype::Qcint4,
                    &dims,
                    ChannelwiseQuantization {
                        zero_point: 8,
                        scales,
                        channel_dim,
                    },
                    ValueRole::Static(&stored[..stored_len]),
                )
                .unwrap()
            },
            bias,
            FullyConnectedFlags {
                transpose_weights: transposed,
                reshape_2d: false,
            },
        );
        let actual = run(&g, &x, batch * outputs);
        assert_within_qd8_bound(&actual, &x, &w, bias, inputs, outputs);
    }
}

fn bf16_bits(v: f32) -> u16 {
    // The scales used are exact in bf16 (few mantissa bits), so truncation is exact.
    (v.to_bits() >> 16) as u16
}

#[test]
fn qd8_activations_times_qb4w_weights_match_reference() {
    for batch in QD8_BATCHES {
        eprintln!("batch {batch}: {}", kernels_line(&[Qd8Weights::Qb4w]));
        check_qd8_qb4w(Qb4wCase {
            batch,
            inputs: 64,
            outputs: 40,
            block: 32,
            activations: Activations::Random,
            for_qb4w_gemm: false,
        });
    }
}

/// The same GEMMs with the activations converted for qp8 GEMMs, as the delegate converts those
/// that only 4-bit blockwise layers read: on aarch64 with i8mm or the dot product XNNPACK then
/// runs KleidiAI's kernels (16-row tiles on i8mm, so 17 and 33 rows leave a tile of one), on
/// other CPUs the plain qd8 ones. Each is within the bound of quantizing the activations.
#[test]
fn activations_converted_for_qb4w_gemms_match_reference() {
    for batch in QD8_BATCHES.chain([32, 33]) {
        for (inputs, block, outputs) in [(64, 32, 40), (128, 32, 33), (256, 64, 48)] {
            check_qd8_qb4w(Qb4wCase {
                batch,
                inputs,
                outputs,
                block,
                activations: Activations::Random,
                for_qb4w_gemm: true,
            });
        }
    }
}

/// The GEMMs an LLM runs: one row for every decoded token, more for a prefill (2, 3 and 5 rows
/// leave a 4-row kernel tiles of fewer rows; 16 are four tiles of 4), at every remainder of 8
/// and 16 columns (the x86 kernels' tiles), blocks of 32 to 256 and rows of up to 520 blocks.
/// On AVX2 CPUs without AVX512-VNNI these are xnnblob's own kernels (sys/xnnpack-sys/kernels/x86_64, patch 0015), which
/// sum in 16-bit lanes.
/// The activations lie on grids dynamic quantization maps exactly onto int8, each row's its own
/// (see [`Activations::OnGrid`]), so the result is checked to float rounding, not to the loose
/// bound of quantizing them; the extreme cases give the largest sums those lanes hold.
#[test]
fn qd8_qb4w_matches_reference_at_every_column_remainder_block_size_and_row_count() {
    eprintln!("{}", kernels_line(&[Qd8Weights::Qb4w]));
    // 16640 is 520 blocks of 32: past the 512 whose activation sums the AVX2 kernels keep.
    let shapes = [
        (32, 32),
        (96, 32),
        (256, 64),
        (512, 128),
        (1024, 256),
        (2048, 32),
        // One block longer than the 2048 bytes of a row that xnnblob's AVX512-VNNI kernels
        // (patch 0028) take at a time.
        (4096, 4096),
        (16640, 32),
    ];
    // Each row count up to the longest rows it needs, which keeps the suite's time under qemu in
    // bounds: 1 and 2 rows past the 512 blocks (one row and an aliased tile), 3 and 5 (4 + 1) to
    // 2048, 11 (one aliased tile of 12 on AVX512-VNNI) and 16 (four tiles of 4 on AVX2, two of 8
    // on AVX512-VNNI) to 256.
    for (batch, longest) in [
        (1, 16640),
        (2, 16640),
        (3, 2048),
        (5, 2048),
        (11, 256),
        (16, 256),
    ] {
        for (inputs, block) in shapes.into_iter().filter(|&(inputs, _)| inputs <= longest) {
            for outputs in [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 23, 24, 33] {
                for activations in [Activations::OnGrid, Activations::Extreme] {
                    check_qd8_qb4w(Qb4wCase {
                        batch,
                        inputs,
                        outputs,
                        block,
                        activations,
                        for_qb4w_gemm: false,
                    });
                }
            }
        }
    }
}

/// The shape and values of one qd8 x qb4w fully connected check.
struct Qb4wCase {
    batch: usize,
    inputs: usize,
    outputs: usize,
    block: usize,
    activations: Activations,
    /// Whether the activations are converted for qp8 GEMMs
    /// (`Subgraph::define_convert_for_qb4w_gemm`, as the delegate converts them).
    for_qb4w_gemm: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Activations {
    /// Uniform in [-1, 1): checked against the bound of quantizing them.
    Random,
    /// Row r: multiples of 2^-(r % 3) / 128 from (-128 + 8j) to (127 + 8j) of them, j = r % 4,
    /// both ends in every row. The row's range holds 0 and is 255 steps, so XNNPACK's
    /// quantization step is exactly the grid's, its zero point -8j, and every activation
    /// quantizes with no error. Checked to float rounding; the rows differ in scale and zero
    /// point, as a prefill's do.
    OnGrid,
    /// On the grid, every activation -1 but the first of each row (127/128), and every weight
    /// nibble 15 (7 once the zero point is removed): xnnblob's AVX2 kernels (patch 0015)
    /// multiply the activations by the nibbles as they are, so these are the largest products
    /// they sum.
    Extreme,
}

fn check_qd8_qb4w(case: Qb4wCase) {
    let Qb4wCase {
        batch,
        inputs,
        outputs,
        block,
        activations,
        for_qb4w_gemm,
    } = case;
    let blocks = inputs / block;
    let mut rng = SplitMix64(61 + (inputs * 64 + outputs) as u64);
    let x: Vec<f32> = match activations {
        Activations::Random => random(&mut rng, batch * inputs, 1.0),
        Activations::OnGrid => (0..batch * inputs)
            .map(|i| {
                let row = i / inputs;
                let step = 1.0 / (128 << (row % 3)) as f32;
                let offset = 8 * (row % 4) as i32;
                let q = match i % inputs {
                    0 => -128,
                    1 => 127,
                    _ => (rng.next_u64() % 256) as i32 - 128,
                };
                (q + offset) as f32 * step
            })
            .collect(),
        Activations::Extreme => (0..batch * inputs)
            .map(|i| if i % inputs == 0 { 127.0 / 128.0 } else { -1.0 })
            .collect(),
    };
    let nibbles: Vec<u8> = (0..outputs * inputs)
        .map(|_| match activations {
            Activations::Extreme => 15,
            _ => (rng.next_u64() % 16) as u8,
        })
        .collect();
    let packed = pack_nibble_rows(&nibbles, inputs, 8);
    let packed_len = packed.len();
    let packed = padded(packed);
    // Scales 2^-6 · {1, 1.5, 1.25, 1.75}: exact in bf16.
    let scale_of = |o: usize, blk: usize| (1.0 + 0.25 * ((o + 3 * blk) % 4) as f32) / 64.0;
    let scales: Vec<u16> = (0..outputs)
        .flat_map(|o| (0..blocks).map(move |blk| bf16_bits(scale_of(o, blk))))
        .collect();
    let scales = padded(scales);
    let scales = &scales[..outputs * blocks];
    let bias = padded(random(&mut rng, outputs, 0.3));
    let bias = &bias[..outputs];
    let w: Vec<f32> = (0..outputs * inputs)
        .map(|i| {
            let (o, k) = (i / inputs, i % inputs);
            (nibbles[i] as f32 - 8.0) * scale_of(o, k / block)
        })
        .collect();

    let convert = if for_qb4w_gemm {
        Subgraph::define_convert_for_qb4w_gemm
    } else {
        Subgraph::define_convert
    };
    let g = qd8_fully_connected_graph_converted(
        batch,
        inputs,
        outputs,
        |g| {
            g.define_blockwise_quantized_tensor(
                Datatype::Qbint4,
                &[outputs, inputs],
                BlockwiseQuantization {
                    zero_point: 8,
                    scales: BlockwiseScales::InMemory(scales),
                    channel_dim: 0,
                    block_size: block,
                },
                ValueRole::Static(&packed[..packed_len]),
            )
            .unwrap()
        },
        bias,
        FullyConnectedFlags::default(),
        convert,
    );
    let actual = run(&g, &x, batch * outputs);
    if activations == Activations::Random {
        assert_within_qd8_bound(&actual, &x, &w, bias, inputs, outputs);
        return;
    }
    // Exact products (a multiple of 1/128 times a nibble times a power-of-two scale), summed in
    // f64; XNNPACK's float additions (one per block, the row terms, a few lane reductions) each
    // round by at most 2^-24 of what they add up. What they add up depends on the kernel: the
    // AVX512-VNNI ones multiply activations shifted to unsigned (x + 1 here, 128 steps of 1/128)
    // and take the shift's share (sum(w)) back through the row terms, so the terms they round are
    // up to (|x| + 1) |w| each, and sum(|w|) once more; the packer sums those row terms 16 k at a
    // time, one rounding each.
    for b in 0..batch {
        for o in 0..outputs {
            let row = &x[b * inputs..(b + 1) * inputs];
            let column = &w[o * inputs..(o + 1) * inputs];
            let pairs = row
                .iter()
                .zip(column)
                .map(|(&x, &w)| (f64::from(x), f64::from(w)));
            let expected = pairs.clone().map(|(x, w)| x * w).sum::<f64>() + f64::from(bias[o]);
            let magnitude = pairs.map(|(x, w)| (x.abs() + 2.0) * w.abs()).sum::<f64>()
                + f64::from(bias[o]).abs();
            let roundings = inputs / 16 + blocks + 8;
            let tolerance = roundings as f64 * 6e-8 * magnitude;
            let got = f64::from(actual[b * outputs + o]);
            assert!(
                (got - expected).abs() <= tolerance,
                "{activations:?} inputs {inputs} block {block} outputs {outputs}: row {b} output {o}: \
                 {got} vs reference {expected} (tolerance {tolerance:e})"
            );
        }
    }
}

/// The quantized fully connected checks again, on an AVX2-only CPU (emulated: qemu has no
/// AVX-512), where XNNPACK dispatches its AVX2 kernel families instead of this machine's.
#[cfg(target_arch = "x86_64")]
#[test]
fn qd8_fully_connected_also_matches_on_an_avx2_only_cpu() {
    common::assert_pass_on_emulated_cpu(
        module_path!(),
        "Haswell-v4",
        "__avx2",
        &[
            "qd8_activations_times_qc8w_weights_match_dequantized_fp32_reference",
            "qd8_activations_times_qc4w_weights_match_reference_with_odd_and_transposed_rows",
            "qd8_activations_times_qb4w_weights_match_reference",
            // On an AVX-512 machine the only run of xnnblob's AVX2 qb4w kernels (xnnpack-sys
            // patch 0015) at their edges.
            "qd8_qb4w_matches_reference_at_every_column_remainder_block_size_and_row_count",
        ],
    );
}
