//! A warm execute allocates nothing: counted by a global allocator over 100 executes after
//! warm-up, through the delegate and a whole method (at changing shapes too). The C++ face's
//! count is in `faces/checks/tests/cpp_allocations.rs`. Only this thread's allocations count
//! (tests run in parallel).

use xnnblob_test_support as common;

use common::counting::{Counting, allocations};
use std::path::Path;
use xnnblob::backend::Backend;
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{InMemoryMap, NamedDataMap};
use xnnblob::program::Program;
use xnnblob::tensor::{DType, PaddedTensor, Shape, TensorMut, TensorRef};
use xnnblob_test_support::synthetic::Mlp;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn mlp_delegate() -> (XnnDelegate, Vec<u8>, InMemoryMap) {
    let mlp = Mlp::random(&[32, 64, 48, 16], 21);
    let built = xnnblob_test_support::synthetic::mlp_payload(&mlp, 2);
    let map = built.map("mlp").unwrap();
    let mut holder = InMemoryMap::new("payload");
    holder.insert("p", &built.payload, 64, None).unwrap();
    let backend = Backend::with_defaults().unwrap();
    let model = backend.model(None).unwrap();
    let d = XnnDelegate::init(&model, holder.get_data("p").unwrap(), &map).unwrap();
    (d, built.payload, map)
}

#[test]
fn a_warm_delegate_execute_allocates_nothing() {
    let (mut d, _, _) = mlp_delegate();
    let shape = Shape::new(&[2, 32]).unwrap();
    let input: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
    let mut padded = PaddedTensor::zeros(DType::F32, shape).unwrap();
    padded.data_mut().copy_from_slice(
        &input
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let mut out = vec![0f32; 32];
    let mut run = |padded_input: bool| {
        let view = if padded_input {
            padded.as_ref()
        } else {
            TensorRef::f32(shape, &input)
        };
        let mut outs = [TensorMut::f32(&mut out)];
        d.execute(&[view], &mut outs).unwrap();
        assert_eq!(outs[0].shape().dims(), &[2, 16]);
    };
    run(false);
    run(true);
    let n = allocations(|| (0..100).for_each(|i| run(i % 2 == 0)));
    assert_eq!(n, 0, "allocations in 100 warm delegate executes");
}

#[test]
fn a_warm_method_execute_allocates_nothing_even_as_shapes_change() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/runtime-c");
    let backend = Backend::with_defaults().unwrap();
    let program = Program::load(
        &backend,
        data.join("c_dynbatch_xnn_external.pte"),
        &[data.join("c_dynbatch_xnn_external.ptd")],
        None,
    )
    .unwrap();
    let mut m = program.method("forward").unwrap();
    let input: Vec<f32> = (0..8 * 12).map(|i| (i % 13) as f32 / 13.0).collect();
    let shapes: Vec<Shape> = [2, 7, 1, 8]
        .iter()
        .map(|&b| Shape::new(&[b, 12]).unwrap())
        .collect();
    let mut run = |shape: Shape| {
        let rows = shape.dims()[0];
        m.execute(&[TensorRef::f32(shape, &input[..rows * 12])])
            .unwrap();
        assert_eq!(m.output(0).unwrap().shape().dims(), &[rows, 6]);
    };
    for &s in &shapes {
        run(s);
    }
    let same = allocations(|| (0..100).for_each(|_| run(shapes[0])));
    let changing = allocations(|| (0..100).for_each(|i| run(shapes[i % shapes.len()])));
    assert_eq!(
        (same, changing),
        (0, 0),
        "allocations in 100 warm method executes"
    );
}

/// Methods sharing mutable buffers (issue 43): an encoder-decoder's `decode` reads the shared
/// state `encode` wrote, expands, and writes its buffers back, all without allocating.
#[test]
fn warm_executes_of_methods_sharing_state_allocate_nothing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/export");
    let backend = Backend::with_defaults().unwrap();
    let program = Program::load(
        &backend,
        dir.join("shared_encoder_decoder.pte"),
        &[] as &[&Path],
        None,
    )
    .unwrap();
    let (mut encode, mut decode) = (
        program.method("encode").unwrap(),
        program.method("decode").unwrap(),
    );
    let x = vec![0.25f32; encode.input_specs()[0].bound.numel().unwrap()];
    let y = vec![0.5f32; decode.input_specs()[0].bound.numel().unwrap()];
    let (xs, ys) = (encode.input_specs()[0].bound, decode.input_specs()[0].bound);
    let mut run = || {
        encode.execute(&[TensorRef::f32(xs, &x)]).unwrap();
        decode.execute(&[TensorRef::f32(ys, &y)]).unwrap();
        decode.execute(&[TensorRef::f32(ys, &y)]).unwrap();
    };
    run();
    assert_eq!(
        allocations(|| (0..100).for_each(|_| run())),
        0,
        "allocations in 100 warm encode + 2 decode sequences"
    );
}
