//! Cold then warm through the persistent cache, for every operator kind that packs weights:
//! the warm runtime (a new cache object on the same file, as a new process would have) makes no
//! `reserve_space` call, and every run's outputs are bit-identical to XNNPACK without a cache.

use crate::common;

use common::scratch;

use xnnblob::cache::{BlobId, PackedWeightsCache, Registration};
use xnnblob::xnn::{
    ChannelwiseQuantization, Convolution2dParams, Datatype, DepthwiseConvolution2dParams,
    FullyConnectedFlags, Padding2d, Runtime, Subgraph, ValueRole,
};
use xnnblob_test_support::synthetic::SplitMix64;

const INPUT: u32 = 0;
const OUTPUT: u32 = 1;

/// XNNPACK may read up to 16 bytes past static data: keep slack behind every buffer.
fn padded<T: Copy + Default>(mut v: Vec<T>, len: usize) -> Vec<T> {
    v.truncate(len);
    v.resize(len + 16, T::default());
    v
}

fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    padded((0..n).map(|_| rng.unit() * scale).collect(), n)
}

/// Static data a graph hands to XNNPACK, with the identity to register it under.
enum Static<'a> {
    F32(&'a [f32], BlobId),
    I8(&'a [i8], BlobId),
}

fn f32s(data: &[f32]) -> Static<'_> {
    Static::F32(data, BlobId::of_f32s(data))
}

fn register<'c>(cache: &'c PackedWeightsCache, statics: &'c [Static<'c>]) -> Vec<Registration<'c>> {
    statics
        .iter()
        .map(|s| match s {
            Static::F32(d, id) => cache.register(d, *id),
            Static::I8(d, id) => cache.register(d, *id),
        })
        .collect()
}

/// A model: its static buffers with their identities, and how to build its graph.
struct Case<'a> {
    name: &'a str,
    input: Vec<f32>,
    output_len: usize,
    statics: Vec<Static<'a>>,
    build: &'a dyn Fn() -> Subgraph<'a>,
}

fn run(case: &Case<'_>, runtime: &mut Runtime<'_>) -> Vec<f32> {
    let mut out = vec![f32::NAN; case.output_len];
    runtime
        .invoke(&[(INPUT, &case.input)], &mut [(OUTPUT, &mut out)])
        .unwrap();
    out
}

fn cold_then_warm(case: Case<'_>, expected_packs: usize) {
    let dir = scratch(case.name);
    let path = dir.join("w.xbc");
    let graph = (case.build)();
    let plain = run(&case, &mut Runtime::new(&graph, None).unwrap());

    for (launch, packs) in [("cold", expected_packs), ("warm", 0)] {
        let cache = PackedWeightsCache::open(&path).unwrap();
        let registrations = register(&cache, &case.statics);
        let graph = (case.build)();
        let mut runtime = Runtime::new(&graph, Some(&*cache)).unwrap();
        drop(registrations);
        cache.finalize().unwrap();
        let out = run(&case, &mut runtime);
        let stats = cache.stats();
        assert_eq!(
            stats.packed, packs,
            "{} {launch}: reserve_space calls",
            case.name
        );
        assert_eq!(stats.unregistered, 0, "{} {launch}", case.name);
        assert_eq!(
            out, plain,
            "{} {launch}: bit-identical to no cache",
            case.name
        );
        drop(runtime);
        drop(cache);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fc_case(name: &'static str, bias: bool, transposed: bool) {
    let (batch, k, n) = (2, 40, 24);
    let w = random(1, k * n, 0.3);
    let b = random(2, n, 0.1);
    let mut statics = vec![f32s(&w[..k * n])];
    if bias {
        statics.push(f32s(&b[..n]));
    }
    let build = || {
        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&[batch, k], ValueRole::Input(INPUT))
            .unwrap();
        let dims = if transposed { [k, n] } else { [n, k] };
        let wv = g
            .define_f32_tensor(&dims, ValueRole::static_f32(&w[..k * n]))
            .unwrap();
        let bv = bias.then(|| {
            g.define_f32_tensor(&[n], ValueRole::static_f32(&b[..n]))
                .unwrap()
        });
        let y = g
            .define_f32_tensor(&[batch, n], ValueRole::Output(OUTPUT))
            .unwrap();
        let flags = FullyConnectedFlags {
            transpose_weights: transposed,
            ..Default::default()
        };
        g.define_fully_connected_with_flags(x, wv, bv, y, f32::NEG_INFINITY, f32::INFINITY, flags)
            .unwrap();
        g
    };
    cold_then_warm(
        Case {
            name,
            input: random(3, batch * k, 1.0)[..batch * k].to_vec(),
            output_len: batch * n,
            statics,
            build: &build,
        },
        1,
    );
}

#[test]
fn fully_connected_with_bias() {
    fc_case("fc-bias", true, false);
}

#[test]
fn fully_connected_without_bias() {
    fc_case("fc-nobias", false, false);
}

#[test]
fn fully_connected_with_transposed_weights() {
    fc_case("fc-transposed", true, true);
}

#[test]
fn conv2d() {
    let (h, w, cin, cout) = (8, 8, 3, 16);
    let filter = random(4, cout * 3 * 3 * cin, 0.4);
    let bias = random(5, cout, 0.1);
    let flen = cout * 9 * cin;
    let mut params = Convolution2dParams::new(3, 3, cin, cout);
    params.padding = Padding2d::uniform(1);
    let statics = vec![f32s(&filter[..flen]), f32s(&bias[..cout])];
    let build = || {
        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&[1, h, w, cin], ValueRole::Input(INPUT))
            .unwrap();
        let f = g
            .define_f32_tensor(&[cout, 3, 3, cin], ValueRole::static_f32(&filter[..flen]))
            .unwrap();
        let b = g
            .define_f32_tensor(&[cout], ValueRole::static_f32(&bias[..cout]))
            .unwrap();
        let y = g
            .define_f32_tensor(&[1, h, w, cout], ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_convolution_2d(&params, x, f, Some(b), y).unwrap();
        g
    };
    cold_then_warm(
        Case {
            name: "conv2d",
            input: random(6, h * w * cin, 1.0)[..h * w * cin].to_vec(),
            output_len: h * w * cout,
            statics,
            build: &build,
        },
        1,
    );
}

#[test]
fn depthwise_conv2d() {
    let (h, w, c) = (8, 8, 16);
    let filter = random(7, 9 * c, 0.4);
    let bias = random(8, c, 0.1);
    let mut params = DepthwiseConvolution2dParams::new(3, 3, c, 1);
    params.padding = Padding2d::uniform(1);
    let statics = vec![f32s(&filter[..9 * c]), f32s(&bias[..c])];
    let build = || {
        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&[1, h, w, c], ValueRole::Input(INPUT))
            .unwrap();
        let f = g
            .define_f32_tensor(&[1, 3, 3, c], ValueRole::static_f32(&filter[..9 * c]))
            .unwrap();
        let b = g
            .define_f32_tensor(&[c], ValueRole::static_f32(&bias[..c]))
            .unwrap();
        let y = g
            .define_f32_tensor(&[1, h, w, c], ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_depthwise_convolution_2d(&params, x, f, Some(b), y)
            .unwrap();
        g
    };
    cold_then_warm(
        Case {
            name: "depthwise",
            input: random(9, h * w * c, 1.0)[..h * w * c].to_vec(),
            output_len: h * w * c,
            statics,
            build: &build,
        },
        // XNNPACK 4ea82e5 created NHWC depthwise convolutions without the weights cache, so
        // they packed privately on every launch; with patch 0025 they pack once, cold.
        1,
    );
}

#[test]
fn dynamically_quantized_fully_connected_qd8_qc8w() {
    let (batch, k, n) = (3, 64, 32);
    let mut rng = SplitMix64(10);
    let q: Vec<i8> = padded(
        (0..k * n)
            .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
            .collect(),
        k * n,
    );
    let scales = padded((0..n).map(|o| 0.002 + 0.0005 * (o % 5) as f32).collect(), n);
    let bias = random(11, n, 0.2);
    // The packing depends on the weights and their scales: register one combined identity.
    let weights_id = BlobId::combine(&[
        BlobId::of_bytes(&q[..k * n].iter().map(|v| *v as u8).collect::<Vec<u8>>()),
        BlobId::of_f32s(&scales[..n]),
    ]);
    let statics = vec![Static::I8(&q[..k * n], weights_id), f32s(&bias[..n])];
    let build = || {
        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&[batch, k], ValueRole::Input(INPUT))
            .unwrap();
        let xq = g
            .define_dynamically_quantized_tensor(Datatype::Qdint8, &[batch, k], 1)
            .unwrap();
        g.define_convert(x, xq).unwrap();
        let wv = g
            .define_channelwise_quantized_tensor(
                Datatype::Qcint8,
                &[n, k],
                ChannelwiseQuantization {
                    zero_point: 0,
                    scales: &scales[..n],
                    channel_dim: 0,
                },
                ValueRole::static_i8(&q[..k * n]),
            )
            .unwrap();
        let b = g
            .define_f32_tensor(&[n], ValueRole::static_f32(&bias[..n]))
            .unwrap();
        let y = g
            .define_f32_tensor(&[batch, n], ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_fully_connected(xq, wv, Some(b), y, f32::NEG_INFINITY, f32::INFINITY)
            .unwrap();
        g
    };
    cold_then_warm(
        Case {
            name: "qd8-qc8w",
            input: random(12, batch * k, 1.0)[..batch * k].to_vec(),
            output_len: batch * n,
            statics,
            build: &build,
        },
        1,
    );
}
