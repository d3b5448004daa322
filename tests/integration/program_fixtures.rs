//! Whole programs exported by ExecuTorch's own tools, run end to end: execution plans, delegate
//! payloads inline or in segments, external weights, methods that share weights.

use crate::common;
use common::XNNPACK_FIXTURES;

use serde_json::Value;
use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, WeightsCacheChoice};
use xnnblob::program::{Program, ProgramError};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch")
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn manifest(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(format!("{name}.json"))).unwrap()).unwrap()
}

fn load(name: &str, cache: Option<&Path>) -> Program {
    let m = manifest(name);
    let ptds: Vec<PathBuf> = m["ptd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| dir().join(p["file"].as_str().unwrap()))
        .collect();
    let backend = Backend::with_defaults().unwrap();
    let cache = cache.map(|p| WeightsCacheChoice::File(p.to_path_buf()));
    Program::load(
        &backend,
        dir().join(m["pte"]["file"].as_str().unwrap()),
        &ptds,
        cache.as_ref(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// (input file, expected output file per method, tolerance relative to the output range).
fn io(name: &str) -> (String, Vec<String>, f32) {
    let m = manifest(name);
    if let Some(io) = m.get("io") {
        let input = io["inputs"][0]["f32"].as_str().unwrap().to_string();
        if name.starts_with("cnn") {
            return (
                input,
                vec![
                    io["reference_outputs"][0]["f32"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                ],
                1e-5,
            );
        }
        // Quantized: ExecuTorch's own runtime's outputs. Its XNNPACK is newer than ours; the
        // dynamic-quantization kernels agree bit for bit here, but allow 1e-3 of the range.
        return (input, vec![format!("{name}.output_et.f32")], 1e-3);
    }
    let io = m["model"]["io"].as_str().unwrap();
    let outputs = match io {
        "two_methods" => vec![
            "two_methods.output0.f32".into(),
            "two_methods.output1.f32".into(),
        ],
        _ => vec![format!("{io}.output.f32")],
    };
    // fp32 against PyTorch eager: only summation order differs.
    (format!("{io}.input.f32"), outputs, 1e-5)
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let peak = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    common::close::max_abs_difference(a, b) / peak
}

#[test]
fn every_xnnpack_fixture_runs_and_matches() {
    for name in XNNPACK_FIXTURES {
        let program = load(name, None);
        let (input, outputs, tol) = io(name);
        let input = f32s(&dir().join(input));
        let methods: Vec<String> = program
            .method_names()
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(methods.len(), outputs.len(), "{name}: methods {methods:?}");
        for (method, expected) in methods.iter().zip(&outputs) {
            let mut m = program
                .method(method)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let out = m.execute_f32(&[&input]).unwrap();
            let expected = f32s(&dir().join(expected));
            let d = max_rel_diff(&out[0], &expected);
            assert!(d <= tol, "{name}.{method}: {d} > {tol}");
        }
    }
}

#[test]
fn two_methods_sharing_a_layer_load_and_pack_it_once() {
    let program = load("two_methods_xnn_external", None);
    let methods: Vec<String> = program
        .method_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    // forward = lin(x); forward_relu = relu(lin(x)) * 2: the second shares lin's weight and bias.
    let first = program.method(&methods[0]).unwrap();
    let (inits, packed) = (
        program.shared_data().stats().inits,
        program.weights_cache().unwrap().stats().packed,
    );
    assert_eq!(
        (inits, packed),
        (2, 1),
        "lin.weight and lin.bias loaded, lin packed"
    );
    let second = program.method(&methods[1]).unwrap();
    let s = program.shared_data().stats();
    let w = program.weights_cache().unwrap().stats();
    assert_eq!(
        s.hits, 2,
        "the second method reuses both blobs of the first"
    );
    assert_eq!(w.packed, 1, "and packs nothing new");
    assert_eq!(w.hits, 1, "lin's packed weight is found");
    drop((first, second));
}

#[test]
fn with_a_cache_file_the_second_load_packs_nothing() {
    let tmp = common::scratch("program");
    let cache = tmp.join("weights.xbc");
    let (input, _, _) = io("mlp_qd8_qc8w_external");
    let input = f32s(&dir().join(input));
    let run = || {
        let program = load("mlp_qd8_qc8w_external", Some(&cache));
        let mut m = program.method("forward").unwrap();
        let out = m.execute_f32(&[&input]).unwrap();
        let packed = program.weights_cache().unwrap().stats().packed;
        program.weights_cache().unwrap().wait_saved().unwrap();
        (out, packed)
    };
    let (cold, packed_cold) = run();
    let (warm, packed_warm) = run();
    assert_eq!(packed_cold, 3);
    assert_eq!(packed_warm, 0);
    assert_eq!(cold, warm);
}

#[test]
fn methods_not_delegated_to_xnnpack_are_rejected_naming_the_operator() {
    for name in [
        "mlp_portable_inline",
        "mlp_portable_external",
        "stateful_shared",
    ] {
        let program = load(name, None);
        let method = program.method_names()[0].to_string();
        match program.method(&method) {
            Err(ProgramError::NotDelegated { operator, .. }) => {
                assert!(operator.contains("::"), "{name}: {operator}");
            }
            Err(e) => panic!("{name}: {e}"),
            Ok(_) => panic!("{name}: ran a non-delegated method"),
        }
    }
}

/// Issue 43: a buffer one method writes and another only reads as a matmul weight is frozen into
/// the reader's delegate by ExecuTorch's partitioner (`frozen_matmul_operand`, exported without
/// the recipe: ExecuTorch's own outputs for `step` are zeros). xnnblob finds its constant, zeros
/// of the buffer's size, and nothing in the exports that keep their buffers shared or in any
/// other exported program (weights of zeros included: `id_zero_init_*` have no shared buffer).
#[test]
fn a_shared_buffer_frozen_into_a_delegate_is_found_and_only_it() {
    use xnnblob::named_data::FileDataMap;
    use xnnblob::program::frozen_buffer_suspects;
    let export = dir().join("export");
    let frozen = FileDataMap::open(export.join("frozen_matmul_operand.pte")).unwrap();
    let found = frozen_buffer_suspects(&frozen).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].method.as_str(), found[0].delegate, found[0].bytes),
        ("step", 0, 16 * 16 * 4)
    );
    assert_eq!(found[0].buffers, ["value 0 of prefill"]);
    // ExecuTorch's own runtime returns the frozen zeros, where eager does not.
    let calls: serde_json::Value = serde_json::from_slice(
        &std::fs::read(export.join("frozen_matmul_operand.calls.json")).unwrap(),
    )
    .unwrap();
    let step = &calls["calls"][1];
    let read =
        |key: &str| std::fs::read(export.join(step[key][0]["file"].as_str().unwrap())).unwrap();
    assert!(read("outputs_et").iter().all(|&b| b == 0));
    assert!(read("outputs_eager").iter().any(|&b| b != 0));
    let mut clean = 0;
    for entry in std::fs::read_dir(&export).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".pte") && !name.starts_with("frozen_") {
            let map = FileDataMap::open(&path).unwrap();
            assert_eq!(frozen_buffer_suspects(&map).unwrap(), [], "{name}");
            clean += 1;
        }
    }
    assert!(clean >= 20, "{clean} exports checked");
}

#[test]
fn missing_foreign_or_doubled_data_and_truncated_payloads_are_clear_errors() {
    let pte = dir().join("mlp_xnn_external.pte");
    // Missing .ptd: the delegate names the first key it cannot find.
    let p = Program::load(
        &Backend::with_defaults().unwrap(),
        &pte,
        &[] as &[PathBuf],
        None,
    )
    .unwrap();
    let err = xnnblob::report::report(&p.method("forward").err().unwrap());
    assert!(
        err.contains("could not be loaded") && err.contains("not found"),
        "{err}"
    );
    // Another model's .ptd.
    let p = Program::load(
        &Backend::with_defaults().unwrap(),
        &pte,
        &[dir().join("cnn_xnn_external.ptd")],
        None,
    )
    .unwrap();
    let err = xnnblob::report::report(&p.method("forward").err().unwrap());
    assert!(err.contains("not found"), "{err}");
    // A key in two files.
    let ptd = dir().join("mlp_xnn_external.ptd");
    let err = Program::load(
        &Backend::with_defaults().unwrap(),
        &pte,
        &[&ptd, &ptd],
        None,
    )
    .err()
    .unwrap();
    assert!(matches!(err, ProgramError::NamedData(_)), "{err}");
    assert!(err.to_string().contains("is in both"), "{err}");
    // A truncated program: its delegate segment no longer fits.
    let scratch = common::scratch("truncated-pte");
    let tmp = scratch.join("truncated.pte");
    let bytes = std::fs::read(&pte).unwrap();
    std::fs::write(&tmp, &bytes[..bytes.len() - 100]).unwrap();
    let err = Program::load(&Backend::with_defaults().unwrap(), &tmp, &[&ptd], None)
        .err()
        .unwrap();
    let text = xnnblob::report::report(&err);
    assert!(text.contains("segment data"), "{text}");
    // No such method.
    let p = Program::load(&Backend::with_defaults().unwrap(), &pte, &[&ptd], None).unwrap();
    assert!(matches!(
        p.method("backward"),
        Err(ProgramError::NoSuchMethod { .. })
    ));
}
