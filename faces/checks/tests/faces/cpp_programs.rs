//! Whole ExecuTorch programs run from C++ through the bridge (hooks/program_run.cc): the
//! fixtures' outputs, a dynamic batch and fp16 at the boundary, and errors arriving in C++ as
//! exceptions with their message.

use crate::common;

use common::{dir, f32s};
use serde_json::Value;
use xnnblob::tensor::{DType, Shape};

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let peak = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    common::close::max_abs_difference(a, b) / peak
}

fn runtime_c() -> std::path::PathBuf {
    dir().join("runtime-c")
}

fn io(name: &str) -> Value {
    common::io_steps::io(&runtime_c(), name)
}

fn tensor(t: &Value) -> (DType, Shape, Vec<u8>) {
    common::io_steps::tensor(&runtime_c(), t)
}

#[test]
fn programs_run_from_cpp_through_the_bridge() {
    let d = dir();
    let pte = d.join("two_methods_xnn_external.pte");
    let ptds = vec![d
        .join("two_methods_xnn_external.ptd")
        .to_string_lossy()
        .into_owned()];
    let input = f32s(&d.join("two_methods.input.f32"));
    for (method, expected) in [
        ("forward", "two_methods.output0.f32"),
        ("forward_relu", "two_methods.output1.f32"),
    ] {
        let out = xnnblob_checks::cpp_run_program(pte.to_str().unwrap(), &ptds, method, &input)
            .unwrap_or_else(|e| panic!("{}", e.what()));
        let d = max_rel_diff(&out, &f32s(&d.join(expected)));
        assert!(d <= 1e-5, "{method}: {d}");
    }
    // An error in Rust reaches C++ as an exception, and comes back with its message.
    let err = xnnblob_checks::cpp_run_program(pte.to_str().unwrap(), &vec![], "forward", &input)
        .unwrap_err();
    assert!(err.what().contains("not found"), "{}", err.what());
    let err =
        xnnblob_checks::cpp_run_program(pte.to_str().unwrap(), &ptds, "nope", &input).unwrap_err();
    assert!(err.what().contains("no method"), "{}", err.what());
}

#[test]
fn from_cpp_a_dynamic_batch_and_fp16_run_too() {
    for (name, step) in [("c_dynbatch_xnn_external", 1), ("c_mlp_fp16_xnn_inline", 0)] {
        let io = io(name);
        let ptds: Vec<String> = io["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                runtime_c()
                    .join(d.as_str().unwrap())
                    .to_string_lossy()
                    .to_string()
            })
            .collect();
        let (dtype, shape, bytes) = tensor(&io["steps"][step]["inputs"][0]);
        let out = xnnblob_checks::cpp_run_program_raw(
            runtime_c()
                .join(io["program"].as_str().unwrap())
                .to_str()
                .unwrap(),
            &ptds,
            "forward",
            dtype.scalar_type(),
            shape.dims(),
            &bytes,
        )
        .unwrap_or_else(|e| panic!("{name}: {}", e.what()));
        let (_, _, expected) = tensor(&io["steps"][step]["outputs_et"][0]);
        let err = common::io_steps::relative_error(dtype, &out, &expected);
        assert!(err <= 1.5e-3, "{name} from C++: {err}");
    }
}

/// Issue 43 from C++: the methods of one loaded program share its mutable buffers, so an
/// exported prefill/step pair and encoder/decoder give eager PyTorch's outputs call by call.
#[test]
fn from_cpp_methods_sharing_mutable_buffers_give_eagers_outputs() {
    let export = common::repo_root().join("tests/data/executorch/export");
    for name in ["shared_prefill_step", "shared_encoder_decoder"] {
        let description: Value = serde_json::from_slice(
            &std::fs::read(export.join(format!("{name}.calls.json"))).unwrap(),
        )
        .unwrap();
        let ptds: Vec<String> = description["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| export.join(d.as_str().unwrap()).display().to_string())
            .collect();
        let calls = description["calls"].as_array().unwrap();
        let methods: Vec<String> = calls
            .iter()
            .map(|c| c["method"].as_str().unwrap().to_string())
            .collect();
        let (mut inputs, mut eager) = (Vec::new(), Vec::new());
        for c in calls {
            inputs.extend(f32s(&export.join(c["inputs"][0]["file"].as_str().unwrap())));
            eager.push(f32s(
                &export.join(c["outputs_eager"][0]["file"].as_str().unwrap()),
            ));
        }
        let pte = export.join(format!("{name}.pte"));
        let out = xnnblob_checks::cpp_run_calls(pte.to_str().unwrap(), &ptds, &methods, &inputs)
            .unwrap_or_else(|e| panic!("{name}: {}", e.what()));
        let mut at = 0;
        for (k, want) in eager.iter().enumerate() {
            let got = &out[at..at + want.len()];
            at += want.len();
            let d = common::close::relative_difference(got, want);
            assert!(d < 1e-5, "{name} call {k}: {d:e} of eager's range");
        }
        assert_eq!(at, out.len(), "{name}: one output per call");
    }
}

/// Issue 40 through the C++ face: `BackendConfig::packed_cache_layers` under
/// `packed_cache_path`. A cache made by a first load serves a second backend as a read-only
/// layer under a new path: initialising the method there packs nothing and misses nothing.
#[test]
fn a_cpp_backend_configured_with_layers_packs_nothing_they_hold() {
    let data = common::repo_root().join("tests/data/executorch");
    let pte = data.join("mlp_qd8_qc8w_external.pte");
    let ptds = vec![data.join("mlp_qd8_qc8w_external.ptd").display().to_string()];
    let dir = common::scratch("cpp-layers");
    let layer = dir.join("bundle.xbc");
    let none: Vec<String> = Vec::new();
    let cold = xnnblob_checks::cpp_layered_load(
        pte.to_str().unwrap(),
        &ptds,
        "forward",
        layer.to_str().unwrap(),
        &none,
    )
    .unwrap_or_else(|e| panic!("{}", e.what()));
    assert!(cold[0] > 0, "the first load packs: {cold:?}");
    let layers = vec![layer.display().to_string()];
    let writable = dir.join("writable.xbc");
    let first = xnnblob_checks::cpp_layered_load(
        pte.to_str().unwrap(),
        &ptds,
        "forward",
        writable.to_str().unwrap(),
        &layers,
    )
    .unwrap_or_else(|e| panic!("{}", e.what()));
    assert_eq!((first[0], first[2]), (0, 0), "packed, misses: {first:?}");
    assert!(first[1] > 0, "{first:?}");
}
