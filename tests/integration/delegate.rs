//! The XNNPACK delegate on payloads made by the Rust graph builder: outputs against plain Rust
//! references; constants loaded once and weights packed once across delegates; warm launches
//! pack nothing; malformed payloads fail `init` with a typed error.

use crate::common;

use common::close::max_abs_difference;

use common::scratch;

use xnnblob::cache::PackedWeightsCache;
use xnnblob::delegate::{DelegateError, XnnDelegate};
use xnnblob::named_data::{DataBuffer, FileDataMap, InMemoryMap, NamedDataMap};
use xnnblob_test_support::builder::{BuiltGraph, ConvGeometry, GraphBuilder};
use xnnblob_test_support::synthetic::{Mlp, SplitMix64};

fn payload(bytes: &[u8]) -> DataBuffer {
    let mut map = InMemoryMap::new("payload");
    map.insert("p", bytes, 64, None).unwrap();
    map.get_data("p").unwrap()
}

/// A delegate of `bytes` on a backend of its own, with no packed-weight cache.
fn init_without_cache(bytes: &[u8], map: &dyn NamedDataMap) -> Result<XnnDelegate, DelegateError> {
    XnnDelegate::init(
        &common::model_of(&common::new_backend(), None),
        payload(bytes),
        map,
    )
}

fn mlp_graph(mlp: &Mlp, batch: u32) -> BuiltGraph {
    xnnblob_test_support::synthetic::mlp_payload(mlp, batch)
}

fn run(d: &mut XnnDelegate, input: &[f32]) -> Vec<f32> {
    let n: usize = d.output_shapes()[0].iter().product();
    let mut out = vec![f32::NAN; n];
    d.execute_f32(&[input], &mut [&mut out]).unwrap();
    out
}

#[test]
fn mlp_matches_reference() {
    let mlp = Mlp::random(&[32, 64, 48, 16], 21);
    let built = mlp_graph(&mlp, 2);
    let map = built.map("mlp").unwrap();
    let mut d = init_without_cache(&built.payload, &map).unwrap();
    assert_eq!(d.input_shapes(), vec![vec![2, 32]]);
    let input: Vec<f32> = (0..64).map(|i| ((i % 9) as f32 - 4.0) / 4.0).collect();
    let out = run(&mut d, &input);
    let diff = max_abs_difference(&out, &mlp.reference_forward(&input, 2));
    assert!(diff < 1e-4, "{diff}");
}

fn random(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.unit() * scale).collect()
}

/// NHWC convolution, filter [co, kh, kw, ci], padding p, stride 1, then ReLU.
fn conv_ref(
    x: &[f32],
    (h, w, ci): (usize, usize, usize),
    f: &[f32],
    b: &[f32],
    co: usize,
    k: usize,
    p: usize,
) -> Vec<f32> {
    let mut y = vec![0f32; h * w * co];
    for oy in 0..h {
        for ox in 0..w {
            for o in 0..co {
                let mut acc = b[o];
                for ky in 0..k {
                    for kx in 0..k {
                        let (iy, ix) = (
                            (oy + ky) as isize - p as isize,
                            (ox + kx) as isize - p as isize,
                        );
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        for c in 0..ci {
                            acc += x[(iy as usize * w + ix as usize) * ci + c]
                                * f[((o * k + ky) * k + kx) * ci + c];
                        }
                    }
                }
                y[(oy * w + ox) * co + o] = acc.max(0.0);
            }
        }
    }
    y
}

/// Depthwise 3x3, padding 1, filter [1, 3, 3, c], then ReLU.
fn depthwise_ref(x: &[f32], (h, w, c): (usize, usize, usize), f: &[f32], b: &[f32]) -> Vec<f32> {
    let mut y = vec![0f32; h * w * c];
    for oy in 0..h {
        for ox in 0..w {
            for ch in 0..c {
                let mut acc = b[ch];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (iy, ix) = (oy as isize + ky - 1, ox as isize + kx - 1);
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        acc += x[(iy as usize * w + ix as usize) * c + ch]
                            * f[((ky * 3 + kx) as usize) * c + ch];
                    }
                }
                y[(oy * w + ox) * c + ch] = acc.max(0.0);
            }
        }
    }
    y
}

#[test]
fn small_cnn_matches_reference() {
    let (h, w, ci, co, classes) = (8usize, 8usize, 3usize, 8usize, 5usize);
    let mut rng = SplitMix64(5);
    let f1 = random(&mut rng, co * 9 * ci, 0.4);
    let b1 = random(&mut rng, co, 0.1);
    let fd = random(&mut rng, 9 * co, 0.4);
    let bd = random(&mut rng, co, 0.1);
    let wf = random(&mut rng, classes * co, 0.5);
    let bf = random(&mut rng, classes, 0.1);

    let mut g = GraphBuilder::new();
    let x = g.input(&[1, h as u32, w as u32, ci as u32]);
    let f1v = g.constant_f32(&[co as u32, 3, 3, ci as u32], &f1);
    let b1v = g.constant_f32(&[co as u32], &b1);
    let y = g.conv2d(
        x,
        f1v,
        Some(b1v),
        ConvGeometry::square(3, 1),
        0.0,
        f32::INFINITY,
    );
    let fdv = g.constant_f32(&[1, 3, 3, co as u32], &fd);
    let bdv = g.constant_f32(&[co as u32], &bd);
    let y = g.depthwise_conv2d(
        y,
        fdv,
        Some(bdv),
        ConvGeometry::square(3, 1),
        0.0,
        f32::INFINITY,
    );
    let y = g.global_avg_pool(y);
    let y = g.reshape(y, &[1, co as u32]);
    let wv = g.constant_f32(&[classes as u32, co as u32], &wf);
    let bv = g.constant_f32(&[classes as u32], &bf);
    let y = g.fully_connected(y, wv, Some(bv), f32::NEG_INFINITY, f32::INFINITY);
    let y = g.softmax(y);
    g.output(y);
    let built = g.finish();

    let input = random(&mut rng, h * w * ci, 1.0);
    let a = conv_ref(&input, (h, w, ci), &f1, &b1, co, 3, 1);
    let a = depthwise_ref(&a, (h, w, co), &fd, &bd);
    let pooled: Vec<f32> = (0..co)
        .map(|c| (0..h * w).map(|p| a[p * co + c]).sum::<f32>() / (h * w) as f32)
        .collect();
    let logits: Vec<f32> = (0..classes)
        .map(|o| bf[o] + (0..co).map(|c| pooled[c] * wf[o * co + c]).sum::<f32>())
        .collect();
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|l| (l - m).exp()).collect();
    let expected: Vec<f32> = e.iter().map(|v| v / e.iter().sum::<f32>()).collect();

    let map = built.map("cnn").unwrap();
    let mut d = init_without_cache(&built.payload, &map).unwrap();
    let out = run(&mut d, &input);
    let diff = max_abs_difference(&out, &expected);
    assert!(diff < 1e-5, "{diff}: {out:?} vs {expected:?}");
}

#[test]
fn qd8_qc8w_mlp_matches_dequantized_reference() {
    let (batch, k, hidden, n) = (3usize, 64usize, 32usize, 16usize);
    let mut rng = SplitMix64(8);
    let mut layer = |rows: usize, cols: usize| {
        let q: Vec<i8> = (0..rows * cols)
            .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
            .collect();
        let scales: Vec<f32> = (0..rows).map(|r| 0.004 + 0.001 * (r % 5) as f32).collect();
        let bias: Vec<f32> = (0..rows).map(|r| (r as f32 * 0.37).sin() * 0.1).collect();
        (q, scales, bias)
    };
    let l1 = layer(hidden, k);
    let l2 = layer(n, hidden);

    let mut g = GraphBuilder::new();
    let mut x = g.input(&[batch as u32, k as u32]);
    for (i, (q, s, b)) in [&l1, &l2].into_iter().enumerate() {
        let rows = s.len() as u32;
        let cols = (q.len() / s.len()) as u32;
        let xq = g.convert_qd8(x);
        let w = g.constant_qc8w(&[rows, cols], q, s);
        let bv = g.constant_f32(&[rows], b);
        let min = if i == 0 { 0.0 } else { f32::NEG_INFINITY };
        x = g.fully_connected(xq, w, Some(bv), min, f32::INFINITY);
    }
    g.output(x);
    let built = g.finish();

    let input: Vec<f32> = (0..batch * k).map(|i| (i as f32 * 0.11).cos()).collect();
    // fp32 reference with dequantized weights, and its error bound: dynamic per-row int8
    // quantization (asymmetric, step (max - min) / 255) moves each activation by at most one
    // step (rounding plus zero-point nudging), so an output moves by at most step * Σ|w|.
    let forward =
        |x: &[f32], (q, s, b): &(Vec<i8>, Vec<f32>, Vec<f32>), relu: bool, rows_in: usize| {
            let (rows, cols) = (s.len(), q.len() / s.len());
            let mut y = vec![0f32; rows_in * rows];
            let mut bound = vec![0f32; rows_in * rows];
            for r in 0..rows_in {
                let xr = &x[r * cols..(r + 1) * cols];
                let (lo, hi) = xr
                    .iter()
                    .fold((0f32, 0f32), |(l, h), v| (l.min(*v), h.max(*v)));
                let step = (hi - lo) / 255.0;
                for o in 0..rows {
                    let w: Vec<f32> = (0..cols).map(|c| q[o * cols + c] as f32 * s[o]).collect();
                    let v = b[o] + xr.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>();
                    y[r * rows + o] = if relu { v.max(0.0) } else { v };
                    bound[r * rows + o] = step * w.iter().map(|v| v.abs()).sum::<f32>();
                }
            }
            (y, bound)
        };
    let (h1, b1) = forward(&input, &l1, true, batch);
    let (expected, b2) = forward(&h1, &l2, false, batch);
    // The second layer also sees the first layer's error, through its weights (|relu| is
    // 1-Lipschitz).
    let tol: Vec<f32> = (0..batch * n)
        .map(|i| {
            let (r, o) = (i / n, i % n);
            b2[i]
                + (0..hidden)
                    .map(|c| (l2.0[o * hidden + c] as f32 * l2.1[o]).abs() * b1[r * hidden + c])
                    .sum::<f32>()
                + 1e-4
        })
        .collect();
    let map = built.map("qmlp").unwrap();
    let mut d = init_without_cache(&built.payload, &map).unwrap();
    let out = run(&mut d, &input);
    for i in 0..out.len() {
        assert!(
            (out[i] - expected[i]).abs() <= tol[i],
            "{i}: {} vs {} (tol {})",
            out[i],
            expected[i],
            tol[i]
        );
    }
    // The worst-case bound above is rigorous but loose (it assumes every rounding error points
    // the same way). The rounding errors are independent and of either sign, so they largely
    // cancel: require the observed error to also be under 2% of the output range, which a wrong
    // weight, scale or layout could not meet.
    let spread = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = max_abs_difference(&out, &expected);
    assert!(err < spread * 0.02, "error {err} vs outputs up to {spread}");
}

/// Exporters before bf16 scale buffers (ExecuTorch 0.3 to 0.6) wrote a 4-bit blockwise layer's
/// scales inline as fp32. ExecuTorch's backend converts them to the bf16 XNNPACK takes by scaling
/// by 1.00389105 (the f32 1.003891) before truncating; the same program must give the same
/// outputs here, bit for bit, and not those of the scales truncated as they are.
#[test]
fn inline_fp32_blockwise_scales_become_the_bf16_executorchs_backend_makes() {
    let (batch, n, k, group) = (2u32, 8u32, 64u32, 32u32);
    let mut rng = SplitMix64(7);
    let packed: Vec<u8> = (0..n * k / 2)
        .map(|_| (rng.next_u64() & 0xff) as u8)
        .collect();
    let scales: Vec<f32> = (0..n * k / group)
        .map(|_| 0.01 + 0.02 * rng.unit().abs())
        .collect();
    let as_executorch: Vec<u16> = scales
        .iter()
        .map(|s| ((s * 1.003_891_f32).to_bits() >> 16) as u16)
        .collect();
    let truncated: Vec<u16> = scales.iter().map(|s| (s.to_bits() >> 16) as u16).collect();
    assert_ne!(as_executorch, truncated, "some scale rounds up");
    let layer = |weights: &dyn Fn(&mut GraphBuilder) -> xnnblob_test_support::builder::Value| {
        let mut g = GraphBuilder::new();
        let x = g.input(&[batch, k]);
        let xq = g.convert_qd8(x);
        let w = weights(&mut g);
        let y = g.fully_connected(xq, w, None, f32::NEG_INFINITY, f32::INFINITY);
        g.output(y);
        let built = g.finish();
        let map = built.map("m").unwrap();
        let mut d = init_without_cache(&built.payload, &map).unwrap();
        let input: Vec<f32> = (0..batch * k)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 3.0)
            .collect();
        run(&mut d, &input)
    };
    let inline = layer(&|g| g.constant_qb4w_inline_scales(&[n, k], &packed, &scales, group));
    let buffered = |bf16: &[u16]| layer(&|g| g.constant_qb4w(&[n, k], &packed, bf16, group));
    assert_eq!(inline, buffered(&as_executorch));
    assert_ne!(inline, buffered(&truncated));
}

#[test]
fn two_delegates_share_constants_and_packed_weights_and_a_warm_file_packs_nothing() {
    let dir = scratch("share");
    let mlp = Mlp::random(&[32, 48, 16], 3);
    let built = mlp_graph(&mlp, 1);
    let ptd = dir.join("model.ptd");
    built.write_ptd(&ptd).unwrap();
    let map = FileDataMap::open_ptd(&ptd).unwrap();
    let input: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
    let expected = mlp.reference_forward(&input, 1);
    let cache_path = dir.join("weights.xbc");

    let backend = common::new_backend();
    let cache = PackedWeightsCache::open(&cache_path).unwrap();
    let mut a = XnnDelegate::init(
        &common::model_of(&backend, Some(cache.clone())),
        payload(&built.payload),
        &map,
    )
    .unwrap();
    let mut b = XnnDelegate::init(
        &common::model_of(&backend, Some(cache.clone())),
        payload(&built.payload),
        &map,
    )
    .unwrap();
    let s = backend.shared_data().stats();
    assert_eq!(s.inits, 4, "each of the 4 blobs loaded once");
    assert_eq!(s.hits, 4, "the second delegate found them all");
    assert_eq!(cache.stats().packed, 2, "each weight packed once");
    assert_eq!(cache.stats().hits, 2);
    assert!(max_abs_difference(&run(&mut a, &input), &expected) < 1e-4);
    assert!(max_abs_difference(&run(&mut b, &input), &expected) < 1e-4);
    drop((a, b, cache));
    assert_eq!(
        backend.shared_data().stats().entries,
        0,
        "released with the last delegate"
    );

    let cache = PackedWeightsCache::open(&cache_path).unwrap();
    let mut warm = XnnDelegate::init(
        &common::model_of(&common::new_backend(), Some(cache.clone())),
        payload(&built.payload),
        &map,
    )
    .unwrap();
    assert_eq!(cache.stats().packed, 0, "warm: no packing");
    assert!(max_abs_difference(&run(&mut warm, &input), &expected) < 1e-4);
    drop((warm, cache));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn init_err(bytes: &[u8], map: &dyn NamedDataMap) -> DelegateError {
    init_without_cache(bytes, map)
        .err()
        .expect("init must fail")
}

#[test]
fn malformed_payloads_fail_init_with_typed_errors() {
    let mlp = Mlp::random(&[8, 4], 1);
    let built = mlp_graph(&mlp, 1);
    let map = built.map("m").unwrap();
    let good = &built.payload;

    assert!(matches!(
        init_err(&good[..20], &map),
        DelegateError::PayloadTruncated { .. }
    ));
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(b"XH01");
    assert!(matches!(
        init_err(&bad, &map),
        DelegateError::PayloadMagic { .. }
    ));
    assert!(matches!(
        init_err(&good[..good.len() - 40], &map),
        DelegateError::PayloadHeader(_)
    ));
    let mut bad = good.clone();
    let fb_at = u32::from_le_bytes(bad[10..14].try_into().unwrap()) as usize;
    bad[fb_at..fb_at + 4].copy_from_slice(&0x7FFF_FFF0u32.to_le_bytes());
    assert!(matches!(
        init_err(&bad, &map),
        DelegateError::PayloadVerifier(_)
    ));
    let mut bad = good.clone();
    bad[fb_at + 4..fb_at + 8].copy_from_slice(b"XN02");
    assert!(matches!(
        init_err(&bad, &map),
        DelegateError::PayloadIdentifier { found } if found == b"XN02"
    ));

    let empty = InMemoryMap::new("empty");
    match init_err(good, &empty) {
        DelegateError::MissingConstant { key, source } => {
            assert_eq!(key.len(), 64);
            // The map's own typed error is kept as the cause, not flattened into a string.
            let cause = std::error::Error::source(&source)
                .and_then(|e| e.downcast_ref::<xnnblob::named_data::NamedDataError>());
            assert!(
                matches!(
                    cause,
                    Some(xnnblob::named_data::NamedDataError::KeyNotFound { .. })
                ),
                "{source:?}"
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn an_unknown_node_is_rejected_naming_its_type() {
    // Patch the node union type of a one-node graph to 200, past the schema's 47 node types.
    let mlp = Mlp::random(&[8, 4], 2);
    let built = mlp_graph(&mlp, 1);
    let map = built.map("m").unwrap();
    let mut bad = built.payload.clone();
    // The FullyConnected discriminant (2) is stored as a u8 in the XNode table; find the
    // builder's node by flipping each candidate byte until init reports the unknown type.
    let mut found = false;
    for i in 0..bad.len() {
        if bad[i] != 2 {
            continue;
        }
        bad[i] = 200;
        if let Err(DelegateError::UnsupportedNode { name, index: 0 }) =
            init_without_cache(&bad, &map)
        {
            assert_eq!(name, "node type 200");
            found = true;
            break;
        }
        bad[i] = 2;
    }
    assert!(
        found,
        "a payload with an unknown node type is rejected naming it"
    );
}

/// How graph `kind` is laid out around `reshape(x, [2, 12])`, x an input [1, 2, 3, 4] and y an
/// input [2, 12]; one of the graph's outputs is `reshape(x) + y`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum AroundReshape {
    /// Nothing else reads x: the reshape is folded into x's binding.
    Alone,
    /// x is also an output's operand: the reshape stays.
    ReadTwice,
    /// An output (sigmoid(y)) is written between the reshape and the add that reads it: the
    /// reshape stays, as the caller may bind that output over x.
    OutputWrittenBetween,
    /// The add that reads the reshape writes an output itself: the reshape stays, for the
    /// same reason.
    ReaderWritesOutput,
    /// sigmoid(y) is computed between the reshape and the add, and copied (`XNNCopy`) into an
    /// output after the add: XNNPACK fuses the copy into the sigmoid, which then writes the
    /// output between, so the reshape stays.
    OutputCopiedBetween,
}

fn around_reshape(kind: AroundReshape) -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 2, 3, 4]);
    let y = g.input(&[2, 12]);
    let r = g.reshape(x, &[2, 12]);
    let between = match kind {
        AroundReshape::OutputWrittenBetween | AroundReshape::OutputCopiedBetween => {
            Some(g.sigmoid(y))
        }
        _ => None,
    };
    if let (AroundReshape::OutputWrittenBetween, Some(s)) = (kind, between) {
        g.output(s);
    }
    let sum = g.add(r, y, f32::NEG_INFINITY, f32::INFINITY);
    if kind == AroundReshape::ReaderWritesOutput {
        g.output(sum);
    } else {
        // Written out by a node of its own (a reshape to the same shape, which XNNPACK does
        // not fuse).
        g.output_copy(sum);
    }
    if let (AroundReshape::OutputCopiedBetween, Some(s)) = (kind, between) {
        let copied = g.unary_node(xnnblob::schema::xnn::XNodeUnion::XNNCopy, s);
        g.output(copied);
    }
    if kind == AroundReshape::ReadTwice {
        let doubled = g.add(x, x, f32::NEG_INFINITY, f32::INFINITY);
        g.output(doubled);
    }
    g.finish()
}

#[test]
fn a_static_reshape_of_an_input_is_folded_into_its_binding_and_keeps_the_inputs_contract() {
    use xnnblob::tensor::{Shape, TensorMut, TensorRef};
    use xnnblob::xnn::XnnError;
    let x: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let y: Vec<f32> = (0..24).map(|i| (i % 5) as f32 - 2.0).collect();
    let expected: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    for kind in [
        AroundReshape::Alone,
        AroundReshape::ReadTwice,
        AroundReshape::OutputWrittenBetween,
        AroundReshape::ReaderWritesOutput,
        AroundReshape::OutputCopiedBetween,
    ] {
        let built = around_reshape(kind);
        let map = built.map("fold").unwrap();
        let mut d = init_without_cache(&built.payload, &map).unwrap();
        // The caller binds the shapes the graph declares, folded or not.
        assert_eq!(
            d.input_shapes(),
            vec![vec![1, 2, 3, 4], vec![2, 12]],
            "{kind:?}"
        );
        let sum_at = usize::from(kind == AroundReshape::OutputWrittenBetween);
        let mut run = |x_shape: &[usize]| {
            let mut outs: Vec<Vec<f32>> = d
                .output_shapes()
                .iter()
                .map(|s| vec![f32::NAN; s.iter().product()])
                .collect();
            let ins = [
                TensorRef::f32(Shape::new(x_shape).unwrap(), &x[..]),
                TensorRef::f32(Shape::new(&[2, 12]).unwrap(), &y[..]),
            ];
            let mut views: Vec<TensorMut<'_>> =
                outs.iter_mut().map(|o| TensorMut::f32(o)).collect();
            d.execute(&ins, &mut views).map(|()| outs[sum_at].clone())
        };
        // Bound as declared, and as another shape of its elements (ExecuTorch's scalars).
        for shape in [&[1, 2, 3, 4][..], &[24][..]] {
            let sum = run(shape).unwrap_or_else(|e| panic!("{kind:?} {shape:?}: {e}"));
            assert_eq!(sum, expected, "{kind:?} {shape:?}");
        }
        // Fewer elements, within the declared bound: the reshape's count no longer holds. The
        // folded input says so itself; otherwise XNNPACK's reshape refuses it.
        let error = run(&[1, 2, 3, 2]).expect_err("12 elements where the reshape takes 24");
        let folded_refusal = matches!(
            &error,
            DelegateError::Xnn {
                error: XnnError::ReshapedInputSize { index: 0, .. },
                ..
            }
        );
        assert_eq!(
            folded_refusal,
            kind == AroundReshape::Alone,
            "{kind:?}: {error:?}"
        );
        // And the delegate still runs afterwards.
        assert_eq!(
            run(&[1, 2, 3, 4]).unwrap(),
            expected,
            "{kind:?} after the refusal"
        );
    }
}
