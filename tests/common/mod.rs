//! Helpers shared by the fixture tests: where ExecuTorch's exported fixtures are, how their raw
//! f32 files and manifests read, and a plain Rust reference for quantized graphs.
#![allow(dead_code)] // each test crate uses its own subset

pub mod qd8_reference;

use serde_json::Value;
use std::path::{Path, PathBuf};

/// `tests/data/executorch`, the fixtures copied from ExecuTorch 1.5.1's exporter.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch")
}

/// A raw little-endian f32 file.
pub fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The manifest `NAME.json` of a fixture.
pub fn manifest(name: &str) -> Value {
    let path = dir().join(format!("{name}.json"));
    serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// The XNNPACK weight types (`qd8_f32_qc8w`, ...) a fixture's delegate runs fully connected
/// layers with, read from its decoded payload.
pub fn qd8_weight_types(manifest: &Value) -> Vec<xnnblob::xnn::Qd8Weights> {
    use xnnblob::xnn::Qd8Weights;
    let Some(types) = manifest["delegates"][0]["value_datatypes"].as_object() else {
        return Vec::new();
    };
    if !types.contains_key("xnn_datatype_qdint8") {
        return Vec::new();
    }
    Qd8Weights::ALL
        .into_iter()
        .filter(|w| {
            let dt = match w {
                Qd8Weights::Qc8w => "xnn_datatype_qcint8",
                Qd8Weights::Qc4w => "xnn_datatype_qcint4",
                Qd8Weights::Qb4w => "xnn_datatype_qbint4",
            };
            types.contains_key(dt)
        })
        .collect()
}

/// One line naming the microkernel XNNPACK runs each of these weight types with on this CPU.
pub fn kernels_line(weights: &[xnnblob::xnn::Qd8Weights]) -> String {
    weights
        .iter()
        .map(|w| {
            let name = xnnblob::xnn::qd8_gemm_kernel(*w)
                .ok()
                .flatten()
                .unwrap_or_else(|| "unknown (XNNPACK not built by xnnpack-sys)".into());
            format!("{} on {name}", w.operator_name())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// max |a - b| and max |b| (the range the difference is judged against).
pub fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len(), "output lengths");
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let range = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    (diff, range)
}
