//! The C++ face: the example of docs/delegate.md and the C++-side checks of the delegate API,
//! both compiled by this crate, run on a model made by the Rust graph builder.

use crate::common;

use common::scratch;

use std::path::Path;
use xnnblob_test_support::synthetic::Mlp;

fn model(dir: &Path) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let mlp = Mlp::random(&[24, 40, 12], 17);
    let built = xnnblob_test_support::synthetic::mlp_payload(&mlp, 1);
    built.write_ptd(&dir.join("model.ptd")).unwrap();
    let input: Vec<f32> = (0..24).map(|i| (i as f32 * 0.3).sin()).collect();
    let expected = mlp.reference_forward(&input, 1);
    (built.payload, input, expected)
}

#[test]
fn the_documented_cpp_example_builds_and_runs() {
    let dir = scratch("example");
    let (payload, input, expected) = model(&dir);
    let ptd = dir.join("model.ptd");
    let out = xnnblob_checks::run_minimal_example(ptd.to_str().unwrap(), &payload, &input).unwrap();
    assert_eq!(out.len(), expected.len());
    for (a, b) in out.iter().zip(&expected) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
    // A C++ exception thrown inside the example reaches Rust as an error with its message.
    let err =
        xnnblob_checks::run_minimal_example("/no/such/model.ptd", &payload, &input).unwrap_err();
    assert!(err.what().contains("/no/such/model.ptd"), "{}", err.what());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_example_in_docs_is_the_compiled_one() {
    let root = common::repo_root();
    let doc = std::fs::read_to_string(root.join("docs/delegate.md")).unwrap();
    let source =
        std::fs::read_to_string(root.join("faces/cxx/examples/minimal_delegate.cc")).unwrap();
    assert!(
        doc.contains(source.trim()),
        "docs/delegate.md must quote faces/cxx/examples/minimal_delegate.cc verbatim"
    );
}

#[test]
fn cpp_checks_of_maps_errors_and_sharing_pass() {
    let dir = scratch("checks");
    let (payload, input, _) = model(&dir);
    let ptd = dir.join("model.ptd");
    let report = xnnblob_checks::cpp_delegate_checks(ptd.to_str().unwrap(), &payload, &input)
        .unwrap_or_else(|e| panic!("{}", e.what()));
    assert_eq!(report, "shared ok; cpp map ok; errors ok; release ok");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cpp_delegate_runs_an_mlp_a_cnn_and_a_qd8_mlp_like_the_rust_one() {
    use xnnblob::delegate::XnnDelegate;
    use xnnblob::named_data::{FileDataMap, InMemoryMap, NamedDataMap};
    let dir = scratch("models");
    let models = [
        (
            "mlp",
            xnnblob_test_support::synthetic::mlp_payload(&Mlp::random(&[16, 32, 8], 4), 2),
        ),
        (
            "cnn",
            xnnblob_test_support::synthetic::cnn_payload(8, 8, 5, 6),
        ),
        (
            "qd8",
            xnnblob_test_support::synthetic::qd8_mlp_payload(&[32, 24, 8], 3, 7),
        ),
    ];
    for (name, built) in models {
        let ptd = dir.join(format!("{name}.ptd"));
        built.write_ptd(&ptd).unwrap();
        let map = FileDataMap::open_ptd(&ptd).unwrap();
        let mut p = InMemoryMap::new("payload");
        p.insert("p", &built.payload, 64, None).unwrap();
        let mut rust = XnnDelegate::init(
            &common::model_of(&common::new_backend(), None),
            p.get_data("p").unwrap(),
            &map,
        )
        .unwrap();
        let n_in: usize = rust.input_shapes()[0].iter().product();
        let input: Vec<f32> = (0..n_in).map(|i| (i as f32 * 0.07).cos()).collect();
        let mut expected = vec![0f32; rust.output_shapes()[0].iter().product()];
        rust.execute_f32(&[&input], &mut [&mut expected]).unwrap();
        // The Rust delegate is checked against references in tests/integration/delegate.rs.
        let out =
            xnnblob_checks::run_minimal_example(ptd.to_str().unwrap(), &built.payload, &input)
                .unwrap();
        assert_eq!(out.as_slice(), expected.as_slice(), "{name}");
        let report =
            xnnblob_checks::cpp_delegate_checks(ptd.to_str().unwrap(), &built.payload, &input)
                .unwrap_or_else(|e| panic!("{name}: {}", e.what()));
        assert_eq!(
            report, "shared ok; cpp map ok; errors ok; release ok",
            "{name}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
