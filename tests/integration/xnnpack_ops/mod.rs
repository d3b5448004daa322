//! Real XNNPACK runs of the subgraph wrapper's operators, each against a plain Rust reference,
//! and the wrapper's refusals of static data and quantization parameters that do not fit.

use crate::common;

use common::close::max_abs_difference;

use common::kernels_line;
use xnnblob::xnn::{
    BlockwiseQuantization, BlockwiseScales, ChannelwiseQuantization, Convolution2dParams, Datatype,
    DepthwiseConvolution2dParams, FullyConnectedFlags, Padding2d, Qd8Weights, Runtime, Status,
    Subgraph, ValueRole, XnnError,
};
use xnnblob_test_support::synthetic::SplitMix64;

mod convolution;
mod qd8;

use qd8::{pack_nibble_rows, qd8_fully_connected_graph};

const INPUT: u32 = 0;
const OUTPUT: u32 = 1;

/// XNNPACK may read up to XNN_EXTRA_BYTES (16) past the end of any tensor data, static data
/// included: static data in these tests is borrowed from buffers with that much slack, as
/// `&padded[..len]`.
fn padded<T: Copy + Default>(mut v: Vec<T>) -> Vec<T> {
    v.extend(std::iter::repeat_n(T::default(), 16));
    v
}

fn random(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * scale).collect()
}

/// Runs a graph with one external input and one external output.
fn run(graph: &Subgraph<'_>, input: &[f32], output_len: usize) -> Vec<f32> {
    let mut runtime = Runtime::new(graph, None).unwrap();
    let mut output = vec![f32::NAN; output_len];
    runtime
        .invoke(&[(INPUT, input)], &mut [(OUTPUT, &mut output)])
        .unwrap();
    output
}

fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32) {
    let diff = max_abs_difference(actual, expected);
    assert!(diff <= tolerance, "max abs diff {diff} > {tolerance}");
    // The reference is not trivially zero: a graph that computes nothing could not pass.
    assert!(
        expected.iter().any(|v| v.abs() > 0.05),
        "degenerate reference"
    );
}

/// `y[b, o] = clamp(Σ_k x[b, k] · w[o, k] + bias[o])`, `w` stored [outputs, inputs].
fn reference_fully_connected(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    batch: usize,
    inputs: usize,
    outputs: usize,
    (min, max): (f32, f32),
) -> Vec<f32> {
    let mut y = vec![0f32; batch * outputs];
    for b in 0..batch {
        for o in 0..outputs {
            let dot: f32 = (0..inputs)
                .map(|k| x[b * inputs + k] * w[o * inputs + k])
                .sum();
            y[b * outputs + o] = (dot + bias.map_or(0.0, |bias| bias[o])).clamp(min, max);
        }
    }
    y
}

#[test]
fn fully_connected_with_and_without_bias_and_with_transposed_weights_matches_reference() {
    let (batch, inputs, outputs) = (3, 20, 12);
    let mut rng = SplitMix64(11);
    let x = random(&mut rng, batch * inputs, 1.0);
    let w = padded(random(&mut rng, outputs * inputs, 0.3));
    let w = &w[..outputs * inputs];
    let mut w_t = vec![0f32; inputs * outputs];
    for o in 0..outputs {
        for k in 0..inputs {
            w_t[k * outputs + o] = w[o * inputs + k];
        }
    }
    let w_t = padded(w_t);
    let w_t = &w_t[..inputs * outputs];
    let bias = padded(random(&mut rng, outputs, 0.5));
    let bias = &bias[..outputs];

    let unclamped = (f32::NEG_INFINITY, f32::INFINITY);
    // (transposed weights?, bias?, output range)
    let cases = [
        (false, true, unclamped),
        (false, false, unclamped),
        (true, true, unclamped),
        (true, false, (-0.4, 0.5)),
    ];
    for (transposed, with_bias, range) in cases {
        let weights = if transposed { w_t } else { w };
        let bias = with_bias.then_some(bias);
        let mut g = Subgraph::new(2).unwrap();
        let input = g
            .define_f32_tensor(&[batch, inputs], ValueRole::Input(INPUT))
            .unwrap();
        let filter_dims = if transposed {
            [inputs, outputs]
        } else {
            [outputs, inputs]
        };
        let filter = g
            .define_f32_tensor(&filter_dims, ValueRole::static_f32(weights))
            .unwrap();
        let bias_id = bias.map(|b| {
            g.define_f32_tensor(&[outputs], ValueRole::static_f32(b))
                .unwrap()
        });
        let output = g
            .define_f32_tensor(&[batch, outputs], ValueRole::Output(OUTPUT))
            .unwrap();
        let flags = FullyConnectedFlags {
            transpose_weights: transposed,
            ..Default::default()
        };
        if flags == FullyConnectedFlags::default() {
            g.define_fully_connected(input, filter, bias_id, output, range.0, range.1)
                .unwrap();
        } else {
            g.define_fully_connected_with_flags(
                input, filter, bias_id, output, range.0, range.1, flags,
            )
            .unwrap();
        }
        let actual = run(&g, &x, batch * outputs);
        let expected = reference_fully_connected(&x, w, bias, batch, inputs, outputs, range);
        assert_close(&actual, &expected, 1e-4);
        if range != unclamped {
            // The clamp took effect: some outputs sit exactly on its bounds.
            assert!(actual.contains(&range.0) && actual.contains(&range.1));
        }
    }
}

/// Each width a 16- or 32-column tile leaves partly empty, in one row and in more rows than a
/// tile has: on AVX-512, patch 0029 runs layers whose channels fill 16-wide tiles with less
/// padding on 16-wide kernels and the rest on the default's 32-wide ones (elsewhere every width
/// takes the default), so each width is checked on whichever its CPU picks.
#[test]
fn fully_connected_matches_reference_at_every_width_a_tile_leaves_partly_empty() {
    let inputs = 19;
    let mut rng = SplitMix64(29);
    let unclamped = (f32::NEG_INFINITY, f32::INFINITY);
    for outputs in (1..=18).chain([24, 31, 32, 33, 47, 48, 64, 80, 112]) {
        for batch in [1, 9] {
            let x = random(&mut rng, batch * inputs, 1.0);
            let w = padded(random(&mut rng, outputs * inputs, 0.3));
            let w = &w[..outputs * inputs];
            let bias = padded(random(&mut rng, outputs, 0.5));
            let bias = &bias[..outputs];
            let mut g = Subgraph::new(2).unwrap();
            let input = g
                .define_f32_tensor(&[batch, inputs], ValueRole::Input(INPUT))
                .unwrap();
            let filter = g
                .define_f32_tensor(&[outputs, inputs], ValueRole::static_f32(w))
                .unwrap();
            let bias_id = g
                .define_f32_tensor(&[outputs], ValueRole::static_f32(bias))
                .unwrap();
            let output = g
                .define_f32_tensor(&[batch, outputs], ValueRole::Output(OUTPUT))
                .unwrap();
            g.define_fully_connected(
                input,
                filter,
                Some(bias_id),
                output,
                unclamped.0,
                unclamped.1,
            )
            .unwrap();
            let actual = run(&g, &x, batch * outputs);
            let expected =
                reference_fully_connected(&x, w, Some(bias), batch, inputs, outputs, unclamped);
            assert_close(&actual, &expected, 1e-4);
        }
    }
}

#[test]
fn transposed_weights_without_the_flag_give_a_different_result() {
    // Guards the test above: a square filter defined with and without the transpose flag
    // must not compute the same thing, or the flag could be silently ignored.
    let n = 8;
    let mut rng = SplitMix64(5);
    let x = random(&mut rng, n, 1.0);
    let w = padded(random(&mut rng, n * n, 0.5));
    let w = &w[..n * n];
    let mut results = Vec::new();
    for transpose_weights in [false, true] {
        let mut g = Subgraph::new(2).unwrap();
        let input = g
            .define_f32_tensor(&[1, n], ValueRole::Input(INPUT))
            .unwrap();
        let filter = g
            .define_f32_tensor(&[n, n], ValueRole::static_f32(w))
            .unwrap();
        let output = g
            .define_f32_tensor(&[1, n], ValueRole::Output(OUTPUT))
            .unwrap();
        let flags = FullyConnectedFlags {
            transpose_weights,
            reshape_2d: false,
        };
        g.define_fully_connected_with_flags(
            input,
            filter,
            None,
            output,
            f32::NEG_INFINITY,
            f32::INFINITY,
            flags,
        )
        .unwrap();
        results.push(run(&g, &x, n));
    }
    assert!(max_abs_difference(&results[0], &results[1]) > 1e-2);
}

#[test]
fn global_average_pooling_2d_matches_reference_with_clamp_and_keep_dims() {
    let (n, h, w, c) = (2, 5, 4, 3);
    let mut rng = SplitMix64(71);
    let x = random(&mut rng, n * h * w * c, 1.0);
    let mut mean = vec![0f32; n * c];
    for b in 0..n {
        for p in 0..h * w {
            for ch in 0..c {
                mean[b * c + ch] += x[(b * h * w + p) * c + ch] / (h * w) as f32;
            }
        }
    }
    // A clamp in the middle of the means, so some are cut and some are not.
    let mut sorted = mean.clone();
    sorted.sort_by(f32::total_cmp);
    let max = (sorted[2] + sorted[3]) / 2.0;

    for keep_dims in [false, true] {
        let out_dims: &[usize] = if keep_dims { &[n, 1, 1, c] } else { &[n, c] };
        let mut g = Subgraph::new(2).unwrap();
        let input = g
            .define_f32_tensor(&[n, h, w, c], ValueRole::Input(INPUT))
            .unwrap();
        let output = g
            .define_f32_tensor(out_dims, ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_global_average_pooling_2d(input, output, f32::NEG_INFINITY, max, keep_dims)
            .unwrap();
        let mut runtime = Runtime::new(&g, None).unwrap();
        assert_eq!(runtime.external_shape(OUTPUT).unwrap(), out_dims);
        let mut actual = vec![f32::NAN; n * c];
        runtime
            .invoke(&[(INPUT, &x)], &mut [(OUTPUT, &mut actual)])
            .unwrap();
        let expected: Vec<f32> = mean.iter().map(|m| m.min(max)).collect();
        let diff = max_abs_difference(&actual, &expected);
        assert!(diff <= 1e-5, "keep_dims {keep_dims}: max abs diff {diff}");
        assert!(expected.iter().filter(|&&v| v == max).count() >= 2);
        assert!(expected.iter().any(|&v| v < max));
    }
}

#[test]
fn elementwise_transpose_reshape_and_softmax_match_reference() {
    // y = reshape(softmax(transpose(clamp((x + b) * (x + b), 0, 1.5)))), x [2, 3], b [1, 3].
    let x = [0.5f32, -1.0, 0.25, 1.5, 0.0, -0.75];
    let b = padded(vec![0.5f32, 0.25, -0.5]);
    let b = &b[..3];

    let mut g = Subgraph::new(2).unwrap();
    let input = g
        .define_f32_tensor(&[2, 3], ValueRole::Input(INPUT))
        .unwrap();
    let bias = g
        .define_f32_tensor(&[1, 3], ValueRole::static_f32(b))
        .unwrap();
    let mut internal = |dims: &[usize]| g.define_f32_tensor(dims, ValueRole::Internal).unwrap();
    let (sum, square, clamped) = (internal(&[2, 3]), internal(&[2, 3]), internal(&[2, 3]));
    let (transposed, soft) = (internal(&[3, 2]), internal(&[3, 2]));
    let output = g
        .define_f32_tensor(&[6], ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_add(input, bias, sum).unwrap();
    g.define_multiply(sum, sum, square).unwrap();
    g.define_clamp(square, clamped, 0.0, 1.5).unwrap();
    g.define_static_transpose(&[1, 0], clamped, transposed)
        .unwrap();
    g.define_softmax(transposed, soft).unwrap();
    g.define_static_reshape(&[6], soft, output).unwrap();
    let actual = run(&g, &x, 6);

    let clamped: Vec<f32> = (0..6)
        .map(|i| {
            let s = x[i] + b[i % 3];
            (s * s).clamp(0.0, 1.5)
        })
        .collect();
    let mut expected = Vec::new();
    for col in 0..3 {
        let row = [clamped[col], clamped[3 + col]];
        let m = row[0].max(row[1]);
        let e = [(row[0] - m).exp(), (row[1] - m).exp()];
        expected.extend(e.map(|v| v / (e[0] + e[1])));
    }
    let diff = max_abs_difference(&actual, &expected);
    assert!(
        diff <= 1e-5,
        "max abs diff {diff}: {actual:?} vs {expected:?}"
    );
    // Not uniform: the transpose decided which pairs were normalised together.
    assert!(expected.iter().any(|v| (v - 0.5).abs() > 0.1));
}

#[test]
fn static_data_of_the_wrong_length_or_alignment_is_a_typed_error() {
    let five = [1.0f32; 5];
    let halves = [0u16; 3];
    let three = [0i8; 3];
    let scales = [0.5f32; 3];
    let bytes = [0x88u8; 10];
    let floats = [0f32; 8];
    let mut g = Subgraph::new(0).unwrap();

    // fp32: 5 floats for a [2, 3] tensor.
    assert_eq!(
        g.define_f32_tensor(&[2, 3], ValueRole::static_f32(&five)),
        Err(XnnError::StaticDataSize {
            datatype: Datatype::Fp32,
            expected_bytes: 24,
            given_bytes: 20
        })
    );
    // fp16 via define_tensor: 3 halves for [2, 2].
    assert_eq!(
        g.define_tensor(Datatype::Fp16, &[2, 2], ValueRole::static_u16(&halves)),
        Err(XnnError::StaticDataSize {
            datatype: Datatype::Fp16,
            expected_bytes: 8,
            given_bytes: 6
        })
    );
    // Per-tensor qint8: 3 bytes for [4].
    assert_eq!(
        g.define_quantized_tensor(Datatype::Qint8, &[4], 0, 0.5, ValueRole::static_i8(&three)),
        Err(XnnError::StaticDataSize {
            datatype: Datatype::Qint8,
            expected_bytes: 4,
            given_bytes: 3
        })
    );

    // qcint4 [3, 5]: three rows of 5 nibbles, each row padded to 3 bytes: 9 bytes; 8 is too
    // few (the whole tensor's 15 nibbles rounded up), 10 too many, 9 is accepted.
    for (len, ok) in [(8, false), (10, false), (9, true)] {
        let result = g.define_channelwise_quantized_tensor(
            Datatype::Qcint4,
            &[3, 5],
            ChannelwiseQuantization {
                zero_point: 8,
                scales: &scales,
                channel_dim: 0,
            },
            ValueRole::Static(&bytes[..len]),
        );
        if ok {
            assert!(result.is_ok(), "{result:?}");
        } else {
            assert_eq!(
                result,
                Err(XnnError::StaticDataSize {
                    datatype: Datatype::Qcint4,
                    expected_bytes: 9,
                    given_bytes: len
                })
            );
        }
    }

    // Right length, misaligned: fp32 data one byte into a float buffer.
    let all = &ValueRole::static_f32(&floats);
    let ValueRole::Static(all) = *all else {
        unreachable!()
    };
    assert_eq!(
        g.define_f32_tensor(&[4], ValueRole::Static(&all[1..17])),
        Err(XnnError::StaticDataAlignment {
            datatype: Datatype::Fp32,
            alignment: 4
        })
    );
    assert!(
        g.define_f32_tensor(&[4], ValueRole::Static(&all[4..20]))
            .is_ok()
    );

    // A shape whose size overflows needs more bytes than any slice holds.
    assert_eq!(Datatype::Fp32.tensor_bytes(&[usize::MAX, 2]), None);
    assert!(matches!(
        g.define_f32_tensor(&[usize::MAX, 2], ValueRole::static_f32(&five)),
        Err(XnnError::StaticDataSize {
            expected_bytes: usize::MAX,
            given_bytes: 20,
            ..
        })
    ));
}

#[test]
fn quantization_parameters_that_do_not_fit_are_refused() {
    let weights = [0i8; 12];
    let nibbles = [0x88u8; 128];
    let eight = [0x3f80u16; 8]; // bf16 1.0
    let two = [0.5f32; 2];
    let three = [0.5f32; 3];
    let bad = [0.5f32, 0.0, 0.5];
    let four = [0.5f32; 4];
    let mut g = Subgraph::new(0).unwrap();

    // Channelwise: 2 scales for 3 channels; a channel dimension past the rank.
    assert_eq!(
        g.define_channelwise_quantized_tensor(
            Datatype::Qcint8,
            &[3, 4],
            ChannelwiseQuantization {
                zero_point: 0,
                scales: &two,
                channel_dim: 0
            },
            ValueRole::static_i8(&weights),
        ),
        Err(XnnError::QuantizationScales {
            expected: 3,
            given: 2
        })
    );
    let err = g
        .define_channelwise_quantized_tensor(
            Datatype::Qcint8,
            &[3, 4],
            ChannelwiseQuantization {
                zero_point: 0,
                scales: &three,
                channel_dim: 2,
            },
            ValueRole::static_i8(&weights),
        )
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidParameter));
    // XNNPACK's own check: a non-positive scale.
    let err = g
        .define_channelwise_quantized_tensor(
            Datatype::Qcint8,
            &[3, 4],
            ChannelwiseQuantization {
                zero_point: 0,
                scales: &bad,
                channel_dim: 0,
            },
            ValueRole::static_i8(&weights),
        )
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidParameter));

    // Blockwise: [4, 64] in blocks of 32 needs 8 scales.
    fn blockwise<'a>(
        g: &mut Subgraph<'a>,
        dims: &[usize],
        scales: &'a [u16],
        block_size: usize,
        nibbles: &'a [u8],
    ) -> Result<u32, XnnError> {
        let bytes = Datatype::Qbint4
            .tensor_bytes(dims)
            .unwrap_or(0)
            .min(nibbles.len());
        g.define_blockwise_quantized_tensor(
            Datatype::Qbint4,
            dims,
            BlockwiseQuantization {
                zero_point: 8,
                scales: BlockwiseScales::InMemory(scales),
                channel_dim: 0,
                block_size,
            },
            ValueRole::Static(&nibbles[..bytes]),
        )
    }
    assert_eq!(
        blockwise(&mut g, &[4, 64], &eight[..7], 32, &nibbles),
        Err(XnnError::QuantizationScales {
            expected: 8,
            given: 7
        })
    );
    for (dims, block_size) in [(&[256][..], 32), (&[4, 64][..], 0), (&[1, 4, 64][..], 32)] {
        let err = blockwise(&mut g, dims, &eight, block_size, &nibbles).unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidParameter), "{dims:?}");
    }
    let filter = blockwise(&mut g, &[4, 64], &eight, 32, &nibbles).unwrap();

    // A transposed qbint4 filter has no packing in this XNNPACK: refused, not run.
    let input = g.define_f32_tensor(&[1, 4], ValueRole::Internal).unwrap();
    let output = g.define_f32_tensor(&[1, 64], ValueRole::Internal).unwrap();
    let err = g
        .define_fully_connected_with_flags(
            input,
            filter,
            None,
            output,
            f32::NEG_INFINITY,
            f32::INFINITY,
            FullyConnectedFlags {
                transpose_weights: true,
                reshape_2d: false,
            },
        )
        .unwrap_err();
    assert_eq!(
        err,
        XnnError::Call {
            call: "xnn_define_fully_connected",
            status: Status::InvalidParameter
        }
    );

    // A transposed qcint4 filter with an odd dimension would be read in another layout (and
    // past its end on some CPUs): refused. The same filter untransposed is fine.
    let q4 = g
        .define_channelwise_quantized_tensor(
            Datatype::Qcint4,
            &[3, 4],
            ChannelwiseQuantization {
                zero_point: 8,
                scales: &four,
                channel_dim: 1,
            },
            ValueRole::Static(&nibbles[..6]),
        )
        .unwrap();
    let x3 = g.define_f32_tensor(&[1, 3], ValueRole::Internal).unwrap();
    let y4 = g.define_f32_tensor(&[1, 4], ValueRole::Internal).unwrap();
    let transposed = FullyConnectedFlags {
        transpose_weights: true,
        reshape_2d: false,
    };
    let err = g
        .define_fully_connected_with_flags(
            x3,
            q4,
            None,
            y4,
            f32::NEG_INFINITY,
            f32::INFINITY,
            transposed,
        )
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidParameter));

    // Global average pooling needs a known input of rank 3 or more.
    let flat = g.define_f32_tensor(&[2, 3], ValueRole::Internal).unwrap();
    let pooled = g.define_f32_tensor(&[2], ValueRole::Internal).unwrap();
    for bad_input in [flat, 12345] {
        let err = g
            .define_global_average_pooling_2d(
                bad_input,
                pooled,
                f32::NEG_INFINITY,
                f32::INFINITY,
                false,
            )
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidParameter));
    }
}

/// Regression for XNNPACK's f32 x qc4w kernels on aarch64 (patches/0003-*): with an odd number
/// of inputs each row's last byte holds a spare high nibble, here the zero point (the only value
/// the qd8 path reads right, see `pack_nibble_rows`); the NEON kernels added it into the last
/// weight for every odd row count and every batch. Even and odd row lengths around one and two
/// bytes of NEON loads, every batch up to the 6-row tile and past it, and an output count that
/// leaves a partial 8-column tile.
#[test]
fn fp32_activations_times_qc4w_weights_with_odd_rows_match_reference() {
    let mut failures = Vec::new();
    let mut seed = 81;
    for inputs in [9, 1, 8, 10, 15, 16, 17, 33] {
        for batch in 1..=7 {
            for outputs in [6, 11] {
                let diff = f32_qc4w_difference(batch, inputs, outputs, seed);
                seed += 1;
                if diff > 1e-4 {
                    failures.push(format!(
                        "batch {batch}, {inputs} inputs, {outputs} outputs: max abs diff {diff}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} shapes over 1e-4:\n{}",
        failures.len(),
        8 * 7 * 2,
        failures.join("\n")
    );
}

/// The other 4-bit path: fp32 activations straight into a qcint4 filter. Its packing reads the
/// same byte-per-row layout; with no activation quantization the result is fp32-exact up to
/// summation order. Returns the largest difference to the reference.
fn f32_qc4w_difference(batch: usize, inputs: usize, outputs: usize, seed: u64) -> f32 {
    let mut rng = SplitMix64(seed);
    let x = random(&mut rng, batch * inputs, 1.0);
    let nibbles: Vec<u8> = (0..outputs * inputs)
        .map(|_| (rng.next_u64() % 16) as u8)
        .collect();
    let stored = pack_nibble_rows(&nibbles, inputs, 8);
    let stored_len = stored.len();
    assert_eq!(stored_len, outputs * inputs.div_ceil(2));
    let stored = padded(stored);
    let scales = padded((0..outputs).map(|o| 0.05 + 0.01 * o as f32).collect());
    let scales = &scales[..outputs];
    let w: Vec<f32> = (0..outputs * inputs)
        .map(|i| (nibbles[i] as f32 - 8.0) * scales[i / inputs])
        .collect();

    let mut g = Subgraph::new(2).unwrap();
    let input = g
        .define_f32_tensor(&[batch, inputs], ValueRole::Input(INPUT))
        .unwrap();
    let filter = g
        .define_channelwise_quantized_tensor(
            Datatype::Qcint4,
            &[outputs, inputs],
            ChannelwiseQuantization {
                zero_point: 8,
                scales,
                channel_dim: 0,
            },
            ValueRole::Static(&stored[..stored_len]),
        )
        .unwrap();
    let output = g
        .define_f32_tensor(&[batch, outputs], ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_fully_connected(
        input,
        filter,
        None,
        output,
        f32::NEG_INFINITY,
        f32::INFINITY,
    )
    .unwrap();
    let actual = run(&g, &x, batch * outputs);
    let expected = reference_fully_connected(
        &x,
        &w,
        None,
        batch,
        inputs,
        outputs,
        (f32::NEG_INFINITY, f32::INFINITY),
    );
    assert_eq!(actual.len(), expected.len());
    // The reference is not trivially zero: a graph that computes nothing could not pass.
    assert!(
        inputs < 8 || expected.iter().any(|v| v.abs() > 0.05),
        "batch {batch}, {inputs} inputs: degenerate reference"
    );
    max_abs_difference(&actual, &expected)
}

// The one definition of "the outputs match" every test uses (test-support/src/close.rs) fails on
// what a fold with f32::max used to pass: an unwritten, NaN-seeded output, and an empty one.

#[test]
#[should_panic(expected = "difference inf")]
fn an_all_nan_output_fails_the_closeness_check() {
    use common::close::{Tolerance, assert_close};
    let expected = [1.0, -2.0, 3.0];
    assert_close(
        &[f32::NAN; 3],
        &expected,
        Tolerance::Absolute(1e-3),
        "all NaN",
    );
}

#[test]
#[should_panic(expected = "output lengths")]
fn an_empty_output_fails_the_closeness_check() {
    use common::close::{Tolerance, assert_close};
    assert_close(&[], &[1.0], Tolerance::OfRange(1e-3), "empty");
}

#[test]
fn one_nan_among_good_values_is_an_infinite_difference() {
    use common::close::{Tolerance, assert_close, relative_difference};
    assert_eq!(
        relative_difference(&[1.0, f32::NAN], &[1.0, 2.0]),
        f32::INFINITY
    );
    assert_close(
        &[1.0, 2.0005],
        &[1.0, 2.0],
        Tolerance::Absolute(1e-3),
        "close",
    );
}

/// XNNPACK's memory plan reuses the space below the lowest live tensor (patch 0005): in
/// input -> clamp -> a (4 MiB) -> slice -> b (2 MiB) -> slice -> c (1 MiB) -> clamp -> output, a
/// and c are never live together, so c goes where a was and the arena is a + b, 6 MiB. Unpatched,
/// 4ea82e5 put c after b: 7 MiB (sys/xnnpack-sys/repro/memory_plan.c).
#[test]
fn the_memory_plan_reuses_the_space_below_the_lowest_live_tensor() {
    const MIB_FLOATS: usize = 1 << 18;
    let mut g = Subgraph::new(2).unwrap();
    let input = g
        .define_f32_tensor(&[4 * MIB_FLOATS], ValueRole::Input(INPUT))
        .unwrap();
    let mut internal = |n: usize| g.define_f32_tensor(&[n], ValueRole::Internal).unwrap();
    let (a, b, c) = (
        internal(4 * MIB_FLOATS),
        internal(2 * MIB_FLOATS),
        internal(MIB_FLOATS),
    );
    let output = g
        .define_f32_tensor(&[MIB_FLOATS], ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_clamp(input, a, -2.0, 2.0).unwrap();
    g.define_static_slice(&[0], &[2 * MIB_FLOATS], a, b)
        .unwrap();
    g.define_static_slice(&[0], &[MIB_FLOATS], b, c).unwrap();
    g.define_clamp(c, output, -1.0, 1.0).unwrap();
    let x: Vec<f32> = (0..4 * MIB_FLOATS)
        .map(|i| (i % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let mut runtime = Runtime::new(&g, None).unwrap();
    let mut actual = vec![f32::NAN; MIB_FLOATS];
    runtime
        .invoke(&[(INPUT, &x)], &mut [(OUTPUT, &mut actual)])
        .unwrap();
    let expected: Vec<f32> = x[..MIB_FLOATS].iter().map(|v| v.clamp(-1.0, 1.0)).collect();
    assert_eq!(actual, expected);
    let Some(arena) = runtime.workspace_size() else {
        common::cannot_run("this XNNPACK was not built by xnnpack-sys (no internal headers)");
        return;
    };
    let mib = 1usize << 20;
    println!("memory plan: {arena} bytes for tensors of 4, 2 and 1 MiB");
    // Each tensor is padded by XNN_EXTRA_BYTES and aligned: some bytes, never a tensor.
    assert!(arena >= 6 * mib, "{arena}: a and b are live together");
    assert!(
        arena < 6 * mib + 4096,
        "{arena}: c was not placed where a was"
    );
}

/// A blockwise scale that is not a positive normal number is refused where the weights are
/// packed (the runtime's creation), wherever it sits, and every positive normal one is accepted.
/// XNNPACK patch 0007 validates scales there, once, with one vectorized pass, instead of at the
/// tensor's definition and again at the operator's creation one float at a time: a warm LLM
/// launch spent a quarter of its CPU there, and read every scale of the model, though it packed
/// nothing. It must refuse exactly what that test did.
#[test]
fn blockwise_scales_are_refused_where_they_are_packed_exactly_when_not_positive_normal() {
    let (outputs, inputs, block) = (4usize, 64usize, 32usize);
    let packed = vec![0x88u8; outputs * inputs / 2 + 64];
    let bias = vec![0f32; outputs];
    let create = |scales: &[u16]| {
        let g = qd8_fully_connected_graph(
            1,
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
                    ValueRole::Static(&packed[..outputs * inputs / 2]),
                )
                .expect("defined: the scales are checked where they are packed")
            },
            &bias,
            FullyConnectedFlags::default(),
        );
        Runtime::new(&g, None).map(|_| ())
    };
    let one = 0x3F80u16; // 1.0
    let good = [
        one, 0x0080, // the smallest normal
        0x7F7F, // the largest finite
        0x3C80,
    ];
    let bad = [
        0x0000, // +0
        0x8000, // -0
        0x0001, // subnormal
        0x007F, // the largest subnormal
        0xBF80, // -1.0
        0x7F80, // +inf
        0xFF80, // -inf
        0x7FC0, // NaN
        0xFFC1, // negative NaN
    ];
    let count = outputs * inputs / block;
    for value in good {
        let scales = vec![value; count];
        assert!(
            create(&scales).is_ok(),
            "{value:#06x} is a positive normal scale"
        );
    }
    for value in bad {
        for at in [0, count / 2, count - 1] {
            let mut scales = vec![one; count];
            scales[at] = value;
            assert!(
                create(&scales).is_err(),
                "{value:#06x} at block {at} is refused"
            );
        }
    }
}

/// `c[.., m, n] = Σ_k a[.., m, k] · b[.., k, n]` (b read as [.., n, k] when `transpose_b`), the
/// batch dimensions broadcast: `dims_a` and `dims_b` are the batch dimensions of each.
fn reference_batch_matrix_multiply(
    a: &[f32],
    b: &[f32],
    (dims_a, dims_b): (&[usize], &[usize]),
    (m, k, n): (usize, usize, usize),
    transpose_b: bool,
) -> Vec<f32> {
    let dims_c: Vec<usize> = dims_a.iter().zip(dims_b).map(|(x, y)| *x.max(y)).collect();
    let batches: usize = dims_c.iter().product();
    let mut c = vec![0f32; batches * m * n];
    for g in 0..batches {
        // The batch index of c, dimension by dimension, taken modulo each operand's dimension.
        let (mut ga, mut gb, mut rest) = (0, 0, g);
        for d in 0..dims_c.len() {
            let stride: usize = dims_c[d + 1..].iter().product();
            let index = rest / stride;
            rest %= stride;
            ga = ga * dims_a[d] + index % dims_a[d];
            gb = gb * dims_b[d] + index % dims_b[d];
        }
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0f64;
                for p in 0..k {
                    let bv = if transpose_b {
                        b[gb * k * n + j * k + p]
                    } else {
                        b[gb * k * n + p * n + j]
                    };
                    sum += f64::from(a[ga * m * k + i * k + p]) * f64::from(bv);
                }
                c[g * m * n + i * n + j] = sum as f32;
            }
        }
    }
    c
}

#[test]
fn batch_matrix_multiply_of_one_row_and_of_many_matches_reference_with_broadcast_batches() {
    use xnnblob::tensor::{Shape, TensorMut, TensorRef};
    // Both operands are inputs, so XNNPACK packs b every run, or, for one row of a, reads it
    // unpacked (patch 0018): one row and three, from one runtime reshaped between them, each
    // against the reference. Column counts straddle the 32-column tile of the one-row path.
    let mut rng = SplitMix64(18);
    let batch_shapes: [(&[usize], &[usize]); 3] =
        [(&[16], &[16]), (&[2, 3], &[1, 3]), (&[1, 2], &[3, 1])];
    for (dims_a, dims_b) in batch_shapes {
        for &(k, n) in &[(1, 1), (5, 7), (64, 128), (128, 64), (9, 33), (3, 100)] {
            for transpose_b in [false, true] {
                let max_m = 3;
                let shape = |batch: &[usize], rows: usize, cols: usize| {
                    let mut s = batch.to_vec();
                    s.extend([rows, cols]);
                    s
                };
                let b_dims = if transpose_b {
                    shape(dims_b, n, k)
                } else {
                    shape(dims_b, k, n)
                };
                let dims_c: Vec<usize> =
                    dims_a.iter().zip(dims_b).map(|(x, y)| *x.max(y)).collect();
                let mut g = Subgraph::new(3).unwrap();
                let a = g
                    .define_f32_tensor(&shape(dims_a, max_m, k), ValueRole::Input(0))
                    .unwrap();
                let b = g.define_f32_tensor(&b_dims, ValueRole::Input(1)).unwrap();
                let c = g
                    .define_f32_tensor(&shape(&dims_c, max_m, n), ValueRole::Output(2))
                    .unwrap();
                g.define_batch_matrix_multiply(a, b, c, transpose_b)
                    .unwrap();
                let mut runtime = Runtime::new(&g, None).unwrap();
                let b_data = padded(random(&mut rng, b_dims.iter().product(), 1.0));
                let b_data = &b_data[..b_dims.iter().product()];
                // One row, then three, then one again: each reshape chooses its path anew.
                for m in [1, max_m, 1] {
                    let a_shape = shape(dims_a, m, k);
                    let a_data = padded(random(&mut rng, a_shape.iter().product(), 1.0));
                    let a_data = &a_data[..a_shape.iter().product()];
                    let expected = reference_batch_matrix_multiply(
                        a_data,
                        b_data,
                        (dims_a, dims_b),
                        (m, k, n),
                        transpose_b,
                    );
                    let mut out = vec![f32::NAN; expected.len()];
                    let what = format!("a {a_shape:?} b {b_dims:?} transpose_b {transpose_b}");
                    runtime
                        .execute(
                            &[
                                TensorRef::f32(Shape::new(&a_shape).unwrap(), a_data),
                                TensorRef::f32(Shape::new(&b_dims).unwrap(), b_data),
                            ],
                            &mut [TensorMut::f32(&mut out)],
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let diff = max_abs_difference(&out, &expected);
                    assert!(diff <= 1e-4 * (k as f32).sqrt().max(1.0), "{what}: {diff}");
                }
            }
        }
    }
}

/// A chain of `steps` nodes, each `clamp(v + b, -2, 2)` with a static `b`, built after
/// reserving room for `reserve` (values, nodes), or without reserving; its output for `x`.
fn clamped_sums(steps: usize, reserve: Option<(usize, usize)>, x: &[f32], b: &[f32]) -> Vec<f32> {
    let mut g = Subgraph::new(2).unwrap();
    if let Some((values, nodes)) = reserve {
        g.reserve(values, nodes).unwrap();
    }
    let n = x.len();
    let input = g.define_f32_tensor(&[n], ValueRole::Input(INPUT)).unwrap();
    let bias = g.define_f32_tensor(&[n], ValueRole::static_f32(b)).unwrap();
    let output = g
        .define_f32_tensor(&[n], ValueRole::Output(OUTPUT))
        .unwrap();
    let mut at = input;
    for step in 0..steps {
        let sum = g.define_f32_tensor(&[n], ValueRole::Internal).unwrap();
        g.define_add(at, bias, sum).unwrap();
        let next = if step + 1 == steps {
            output
        } else {
            g.define_f32_tensor(&[n], ValueRole::Internal).unwrap()
        };
        g.define_clamp(sum, next, -2.0, 2.0).unwrap();
        at = next;
    }
    run(&g, x, n)
}

#[test]
fn a_subgraph_given_room_first_computes_what_one_grown_value_by_value_does() {
    // 300 nodes and 300 internal values: several of XNNPACK's growth steps of both arrays.
    let steps = 150;
    let x = [1.5f32, -1.75, 0.25, -0.5, 1.0, 0.0, -2.5, 2.5];
    let b = padded(vec![0.01f32, -0.02, 0.03, 0.005, -0.015, 0.02, -0.01, 0.04]);
    let b = &b[..x.len()];
    let expected: Vec<f32> = x
        .iter()
        .zip(b)
        .map(|(&x, &b)| (0..steps).fold(x, |v, _| (v + b).clamp(-2.0, 2.0)))
        .collect();
    for reserve in [None, Some((4, 2)), Some((303, 300)), Some((5000, 4000))] {
        let actual = clamped_sums(steps, reserve, &x, b);
        assert_close(&actual, &expected, 1e-4);
        // The chain moved every element: a graph cut short would leave some where they were.
        assert!(
            actual.iter().zip(&x).all(|(a, x)| (a - x).abs() > 0.1),
            "{reserve:?}: {actual:?}"
        );
    }
    // More than 32-bit ids can name is refused, and the subgraph is left as it was.
    let mut g = Subgraph::new(2).unwrap();
    for (values, nodes) in [(1usize << 32, 1), (1, 1usize << 32)] {
        let err = g.reserve(values, nodes).unwrap_err();
        assert_eq!(
            err.status(),
            Some(Status::InvalidParameter),
            "{values} {nodes}"
        );
    }
    g.define_f32_tensor(&[2], ValueRole::Input(INPUT)).unwrap();
}
