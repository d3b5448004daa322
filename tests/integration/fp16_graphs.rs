//! fp16 graphs whose nodes this XNNPACK has no fp16 kernels for on a CPU without fp16
//! arithmetic (an Armv8.0 core such as the Cortex-A53): softmax alone, and an element-wise node
//! it does run in fp16 there. Both run on every CPU with fp16 inputs and outputs, computed as
//! fp32 exactly where XNNPACK has no fp16 GEMMs (see `src/delegate/fallback.rs`), and match a
//! plain reference within fp16's rounding.

use crate::common;

use xnnblob::backend::Backend;
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{InMemoryMap, NamedDataMap};
use xnnblob::tensor::{DType, Shape, TensorMut, TensorRef, f16_to_f32};
use xnnblob_test_support::builder::{BuiltGraph, GraphBuilder, Value};

const ROWS: u32 = 4;
const COLUMNS: u32 = 24;

/// Inputs in [-3, 3], as fp16 bits and as the fp32 values those bits are.
fn inputs() -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = (0..ROWS * COLUMNS)
        .map(|i| common::half::to_f16(((i * 37 % 97) as f32 / 16.0) - 3.0))
        .collect();
    let values = bits.iter().map(|&b| f16_to_f32(b)).collect();
    (bits, values)
}

/// Runs `graph` (one fp16 input and one fp16 output of the same shape) once without a cache:
/// its output as fp32, and whether it was computed as fp32.
fn run(graph: &BuiltGraph, input: &[u16]) -> (Vec<f32>, bool) {
    let map = graph.map("weights").unwrap();
    let mut payload = InMemoryMap::new("payload");
    payload.insert("p", &graph.payload, 64, None).unwrap();
    let backend = Backend::with_defaults().unwrap();
    let model = backend.model(None).unwrap();
    let mut d = XnnDelegate::init(&model, payload.get_data("p").unwrap(), &map)
        .unwrap_or_else(|e| panic!("fp16 graph: {}", xnnblob::report::report(&e)));
    let bytes: Vec<u8> = input.iter().flat_map(|b| b.to_le_bytes()).collect();
    let shape = Shape::new(&d.input_shapes()[0]).unwrap();
    let mut out = vec![0u8; input.len() * 2];
    d.execute(
        &[TensorRef::new(DType::F16, shape, &bytes)],
        &mut [TensorMut::new(DType::F16, &mut out)],
    )
    .unwrap();
    let output = out
        .chunks_exact(2)
        .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    (output, d.computes_fp16_as_fp32())
}

/// Runs the graph `build` makes on an fp16 input, and checks it against `reference` (on the
/// input's values) within `tolerance` of the range, and the fp32 choice against the probe.
fn check(
    name: &str,
    build: impl Fn(&mut GraphBuilder, Value) -> Value,
    reference: fn(&[f32]) -> Vec<f32>,
) {
    let mut b = GraphBuilder::new();
    let x = b.input_f16(&[ROWS, COLUMNS]);
    let y = build(&mut b, x);
    b.output(y);
    let graph = b.finish();
    let (bits, values) = inputs();
    let (got, as_fp32) = run(&graph, &bits);
    let expected = reference(&values);
    let worst = common::close::relative_difference(&got, &expected);
    let fp16_gemms = xnnblob::xnn::runs_fp16_gemm().unwrap();
    println!(
        "fp16 {name}: {worst:e} of the range from the plain reference; computed as fp32: \
         {as_fp32} (fp16 GEMMs on this CPU: {fp16_gemms})"
    );
    // The output is rounded to fp16 once (as fp32) or per step (fp16 kernels): a few ulp.
    assert!(worst <= 2e-3, "fp16 {name}: {worst}");
    assert_eq!(as_fp32, !fp16_gemms, "fp16 {name}: computed as fp32");
}

/// Softmax has no fp16 kernel without fp16 arithmetic in this XNNPACK: there the graph is
/// computed as fp32; elsewhere it runs in fp16.
#[test]
fn an_fp16_softmax_runs_on_every_cpu() {
    check(
        "softmax",
        |b: &mut GraphBuilder, x| b.softmax(x),
        |x| {
            x.chunks_exact(COLUMNS as usize)
                .flat_map(|row| {
                    let top = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                    let e: Vec<f64> = row.iter().map(|&v| f64::from(v - top).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    e.into_iter().map(move |v| (v / sum) as f32)
                })
                .collect()
        },
    );
}

/// Sigmoid has an fp16 kernel everywhere; without fp16 GEMMs the graph is computed as fp32 all
/// the same, by the rule that covers the nodes that have none.
#[test]
fn an_fp16_sigmoid_runs_on_every_cpu() {
    check(
        "sigmoid",
        |b: &mut GraphBuilder, x| b.sigmoid(x),
        |x| x.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect(),
    );
}
