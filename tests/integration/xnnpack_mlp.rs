//! A real XNNPACK subgraph computes what plain Rust computes.

use crate::common;

use common::close::max_abs_difference;

use xnnblob::xnn::{Runtime, XnnError};
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

#[test]
fn three_layer_mlp_matches_rust_reference_within_1e_4() {
    let mlp = Mlp::random(&[64, 128, 96, 32], 7);
    let batch = 3;
    let input: Vec<f32> = (0..batch * 64)
        .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
        .collect();
    let expected = mlp.reference_forward(&input, batch);

    let graph = mlp.subgraph(batch).unwrap();
    let mut runtime = Runtime::new(&graph, None).unwrap();
    let mut output = vec![f32::NAN; batch * 32];
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut output)])
        .unwrap();

    let diff = max_abs_difference(&output, &expected);
    assert!(diff <= 1e-4, "max abs diff {diff}");
    // The reference is not trivially zero: a broken graph could not pass by accident.
    assert!(expected.iter().any(|v| v.abs() > 0.05));
}

#[test]
fn invoke_rejects_wrong_buffer_sizes_and_unbound_externals() {
    let mlp = Mlp::random(&[8, 4, 4, 2], 1);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, None).unwrap();
    let input = vec![0.5f32; 8];
    let mut short = vec![0f32; 1];
    let err = runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut short)])
        .unwrap_err();
    assert_eq!(
        err,
        XnnError::ExternalSize {
            id: MLP_OUTPUT,
            expected_elements: 2,
            given_elements: 1
        }
    );
    let mut output = vec![0f32; 2];
    let err = runtime
        .invoke(&[], &mut [(MLP_OUTPUT, &mut output)])
        .unwrap_err();
    assert_eq!(err, XnnError::MissingExternal { id: MLP_INPUT });
    let err = runtime
        .invoke(&[(7, &input)], &mut [(MLP_OUTPUT, &mut output)])
        .unwrap_err();
    assert_eq!(err, XnnError::UnknownExternal { id: 7 });
}

#[test]
fn static_data_of_the_wrong_size_is_an_error() {
    use xnnblob::xnn::{Datatype, Subgraph, ValueRole};
    let data = [1.0f32; 5];
    let mut g = Subgraph::new(0).unwrap();
    let err = g
        .define_f32_tensor(&[2, 3], ValueRole::static_f32(&data))
        .unwrap_err();
    assert_eq!(
        err,
        XnnError::StaticDataSize {
            datatype: Datatype::Fp32,
            expected_bytes: 24,
            given_bytes: 20
        }
    );
}
