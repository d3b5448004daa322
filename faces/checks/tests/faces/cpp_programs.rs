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
    let ptds = vec![
        d.join("two_methods_xnn_external.ptd")
            .to_string_lossy()
            .into_owned(),
    ];
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

/// The export `name`'s calls (its NAME.calls.json): the `.ptd` files, the methods in order,
/// their fp32 inputs one after the other, and each call's eager and ExecuTorch outputs.
struct Calls {
    ptds: Vec<String>,
    methods: Vec<String>,
    inputs: Vec<f32>,
    eager: Vec<Vec<f32>>,
    et: Vec<Vec<f32>>,
}

fn export_calls(name: &str) -> Calls {
    let export = common::repo_root().join("tests/data/executorch/export");
    let description: Value =
        serde_json::from_slice(&std::fs::read(export.join(format!("{name}.calls.json"))).unwrap())
            .unwrap();
    let file = |t: &Value| f32s(&export.join(t[0]["file"].as_str().unwrap()));
    let calls = description["calls"].as_array().unwrap();
    Calls {
        ptds: description["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| export.join(d.as_str().unwrap()).display().to_string())
            .collect(),
        methods: calls
            .iter()
            .map(|c| c["method"].as_str().unwrap().to_string())
            .collect(),
        inputs: calls.iter().flat_map(|c| file(&c["inputs"])).collect(),
        eager: calls.iter().map(|c| file(&c["outputs_eager"])).collect(),
        et: calls.iter().map(|c| file(&c["outputs_et"])).collect(),
    }
}

/// Issue 43 from C++: the methods of one loaded program share its mutable buffers, so an
/// exported prefill/step pair and encoder/decoder give eager PyTorch's outputs, and ExecuTorch's
/// own, call by call, cold and warm with a packed-weight cache file (the warm launch packs
/// nothing and finds its weights packed); their loads find no frozen buffer.
#[test]
fn from_cpp_methods_sharing_mutable_buffers_give_eagers_outputs() {
    let export = common::repo_root().join("tests/data/executorch/export");
    let tmp = common::scratch("cpp-shared-state");
    for name in ["shared_prefill_step", "shared_encoder_decoder"] {
        let calls = export_calls(name);
        let pte = export.join(format!("{name}.pte"));
        let cache = tmp.join(format!("{name}.xbc"));
        for launch in ["cold", "warm"] {
            let run = xnnblob_checks::cpp_run_calls(
                pte.to_str().unwrap(),
                &calls.ptds,
                &calls.methods,
                &calls.inputs,
                cache.to_str().unwrap(),
            )
            .unwrap_or_else(|e| panic!("{name} {launch}: {}", e.what()));
            let mut at = 0;
            for (k, (eager, et)) in calls.eager.iter().zip(&calls.et).enumerate() {
                let got = &run.outputs[at..at + eager.len()];
                at += eager.len();
                let d = common::close::relative_difference(got, eager);
                assert!(d < 1e-5, "{name} {launch} call {k}: {d:e} of eager's range");
                let d = common::close::relative_difference(got, et);
                assert!(
                    d < 1e-5,
                    "{name} {launch} call {k}: {d:e} of ExecuTorch's range"
                );
            }
            assert_eq!(at, run.outputs.len(), "{name}: one output per call");
            assert!(run.frozen.is_empty(), "{name}: {:?}", run.frozen);
            if launch == "cold" {
                assert!(run.packed > 0, "{name} cold packs: {}", run.packed);
            } else {
                assert_eq!(run.packed, 0, "{name} warm: nothing packed");
                assert!(run.hits > 0, "{name} warm: weights found packed");
            }
        }
    }
}

/// Issue 43 from C++: a program whose shared buffer ExecuTorch's partitioner froze into `step`'s
/// delegate (`frozen_matmul_operand`) is said by its load, naming the method and the buffer.
/// `step`, which the executor runs (the program's `prefill` needs a portable operator), computes
/// what ExecuTorch's runtime computed from it after `prefill` (zeros), not eager's outputs.
#[test]
fn from_cpp_a_shared_buffer_frozen_into_a_delegate_is_said_at_load() {
    let export = common::repo_root().join("tests/data/executorch/export");
    let all = export_calls("frozen_matmul_operand");
    let steps: Vec<usize> = (0..all.methods.len())
        .filter(|&k| all.methods[k] == "step")
        .collect();
    assert_eq!(steps.len(), 2);
    let description: Value = serde_json::from_slice(
        &std::fs::read(export.join("frozen_matmul_operand.calls.json")).unwrap(),
    )
    .unwrap();
    let inputs: Vec<f32> = steps
        .iter()
        .flat_map(|&k| {
            let call = &description["calls"][k];
            f32s(&export.join(call["inputs"][0]["file"].as_str().unwrap()))
        })
        .collect();
    let methods: Vec<String> = steps.iter().map(|&k| all.methods[k].clone()).collect();
    let pte = export.join("frozen_matmul_operand.pte");
    let run =
        xnnblob_checks::cpp_run_calls(pte.to_str().unwrap(), &all.ptds, &methods, &inputs, "")
            .unwrap_or_else(|e| panic!("{}", e.what()));
    assert_eq!(run.frozen.len(), 1, "{:?}", run.frozen);
    let said = &run.frozen[0];
    assert!(
        said.starts_with("method \"step\", XNNPACK delegate 0")
            && said.contains("value 0 of prefill")
            && said.contains("Methods that share state"),
        "{said}"
    );
    let mut at = 0;
    for &k in &steps {
        let got = &run.outputs[at..at + all.eager[k].len()];
        at += all.eager[k].len();
        let d = common::close::relative_difference(got, &all.et[k]);
        assert!(d < 1e-5, "call {k}: {d:e} of ExecuTorch's range");
        let d = common::close::relative_difference(got, &all.eager[k]);
        assert!(
            d > 0.1,
            "call {k} is eager's only if nothing was frozen ({d:e})"
        );
    }
    assert_eq!(at, run.outputs.len());
}
