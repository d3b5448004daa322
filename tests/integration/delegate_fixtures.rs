//! The delegate on payloads ExecuTorch's exporter wrote (fixtures with their delegate decoded
//! in the manifest): every node type and value datatype reads as the manifest says, and the
//! outputs match ExecuTorch's own runtime and, for quantized graphs, a plain Rust reference.

use crate::common;

use common::{dir, f32s, kernels_line, max_diff, qd8_reference, qd8_weight_types};
use serde_json::Value;
use std::sync::Arc;
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{DataBuffer, FileDataMap, InMemoryMap, MergedMap, NamedDataMap};

/// (name, manifest) of fixtures whose manifest decodes their XNNPACK delegate.
fn delegated() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            if v.get("delegates").is_some() {
                out.push((p.file_stem().unwrap().to_string_lossy().into_owned(), v));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 5);
    out
}

/// The payload (a segment of the program, located by the manifest) and the program's named
/// data merged with its external `.ptd` files.
fn open(manifest: &Value) -> (DataBuffer, MergedMap) {
    let pte_path = dir().join(manifest["pte"]["file"].as_str().unwrap());
    let pte = FileDataMap::open_pte(&pte_path).unwrap();
    let d = &manifest["delegates"][0];
    assert_eq!(d["processed"]["location"], "SEGMENT");
    let (offset, size) = (
        d["processed"]["file_offset"].as_u64().unwrap() as usize,
        d["processed"]["nbytes"].as_u64().unwrap() as usize,
    );
    assert!(
        pte.segments().contains(&(offset, size)),
        "the payload is one of the program's segments"
    );
    let bytes = std::fs::read(&pte_path).unwrap();
    let mut m = InMemoryMap::new("payload");
    m.insert("p", &bytes[offset..offset + size], 64, None)
        .unwrap();
    let payload = m.get_data("p").unwrap();
    let mut maps: Vec<Arc<dyn NamedDataMap>> = vec![Arc::new(pte)];
    for ptd in manifest["ptd"].as_array().unwrap() {
        let path = dir().join(ptd["file"].as_str().unwrap());
        maps.push(Arc::new(FileDataMap::open_ptd(path).unwrap()));
    }
    (payload, MergedMap::new(maps).unwrap())
}

/// Runs a fixture's delegate on its reference input; returns (input, output).
fn run_delegate(name: &str, manifest: &Value) -> (Vec<f32>, Vec<f32>) {
    let (payload, map) = open(manifest);
    let backend = common::new_backend();
    let mut d = XnnDelegate::init(&common::model_of(&backend, None), payload, &map)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let io = &manifest["io"];
    let input = f32s(&dir().join(io["inputs"][0]["f32"].as_str().unwrap()));
    let shape: Vec<usize> = io["inputs"][0]["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(d.input_shapes()[0], shape, "{name}");
    let n: usize = d.output_shapes()[0].iter().product();
    let mut out = vec![f32::NAN; n];
    d.execute_f32(&[&input], &mut [&mut out]).unwrap();
    (input, out)
}

#[test]
fn fixture_payloads_run_and_match_executorch() {
    for (name, manifest) in delegated() {
        let (_, out) = run_delegate(&name, &manifest);
        let kernels = kernels_line(&qd8_weight_types(&manifest));
        // ExecuTorch's own runtime's outputs (same XNNPACK microkernel family, another build).
        let expected = f32s(&dir().join(format!("{name}.output_et.f32")));
        let (diff, spread) = max_diff(&out, &expected);
        eprintln!(
            "{name}: max |xnnblob - executorch| = {diff:e} (outputs up to {spread}) {kernels}"
        );
        // fp32 graphs: only summation order differs. Quantized graphs: the XNNPACK builds
        // differ (ours is 4ea82e5; ExecuTorch 1.5.1 pins a newer one) in dynamic-quantization
        // rounding, so allow 1e-3 of the output range.
        let tol = if name.starts_with("cnn") {
            1e-5
        } else {
            spread * 1e-3
        };
        assert!(diff <= tol, "{name}: {diff} > {tol} ({kernels})");
    }
}

/// A second witness for every quantized fixture, which holds where ExecuTorch's outputs were
/// made on another CPU: the delegate's outputs against dequantize-and-multiply in plain Rust.
/// The reference itself is first checked against ExecuTorch's stored outputs.
#[test]
fn quantized_fixtures_match_a_plain_rust_reference() {
    let mut checked = Vec::new();
    for (name, manifest) in delegated() {
        let weights = qd8_weight_types(&manifest);
        if weights.is_empty() {
            continue;
        }
        let (input, out) = run_delegate(&name, &manifest);
        let (_, map) = open(&manifest);
        let reference = qd8_reference::run(&manifest, &map, &input);
        let expected = f32s(&dir().join(format!("{name}.output_et.f32")));
        let (ref_vs_et, spread) = max_diff(&reference, &expected);
        let (diff, _) = max_diff(&out, &reference);
        let kernels = kernels_line(&weights);
        eprintln!(
            "{name}: max |xnnblob - rust reference| = {diff:e}, |rust reference - executorch| = \
             {ref_vs_et:e} (outputs up to {spread}) {kernels}"
        );
        let tol = spread * 1e-3;
        assert!(
            ref_vs_et <= tol,
            "{name}: the reference itself is off ExecuTorch's outputs by {ref_vs_et} > {tol}"
        );
        assert!(diff <= tol, "{name}: {diff} > {tol} ({kernels})");
        checked.push(name);
    }
    for kind in ["qb4w", "qc4w", "qc8w"] {
        assert!(
            checked.iter().any(|n| n.contains(kind)),
            "no {kind} fixture was checked: {checked:?}"
        );
    }
}

/// The quantized checks above again, on an AVX2-only CPU (emulated: qemu has no AVX-512), where
/// XNNPACK dispatches its AVX2 kernel families instead of this machine's.
#[cfg(target_arch = "x86_64")]
#[test]
fn quantized_fixtures_also_match_on_an_avx2_only_cpu() {
    common::assert_pass_on_emulated_cpu(
        module_path!(),
        "Haswell-v4",
        "__avx2",
        &[
            "fixture_payloads_run_and_match_executorch",
            "quantized_fixtures_match_a_plain_rust_reference",
        ],
    );
}
