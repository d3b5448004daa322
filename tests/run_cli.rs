//! `xnnblob run` on real ExecuTorch programs.

use std::path::Path;
use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xnnblob"))
        .arg("run")
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn run_writes_outputs_and_a_warm_cache_packs_nothing() {
    let tmp = std::env::temp_dir().join(format!("xnnblob-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let cache = tmp.join("w.xbc");
    let out_dir = tmp.join("out");
    let args = [
        "two_methods_xnn_external.pte",
        "--data",
        "two_methods_xnn_external.ptd",
        "--method",
        "forward_relu",
        "--input",
        "two_methods.input.f32",
        "--cache",
        cache.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ];
    let (ok, text) = run(&args);
    assert!(ok, "{text}");
    assert!(
        text.contains("forward_relu") && text.contains("output 0: float32 [2, 32], 64 values"),
        "{text}"
    );
    let got = f32s(&out_dir.join("output0.f32"));
    let want = f32s(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/executorch/two_methods.output1.f32"),
    );
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    let (ok, text) = run(&args);
    assert!(ok && text.contains("(0 weights packed"), "{text}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn run_reports_clear_errors() {
    let (ok, text) = run(&["mlp_portable_inline.pte", "--input", "mlp.input.f32"]);
    assert!(
        !ok && text.contains("not fully delegated") && text.contains("aten::"),
        "{text}"
    );
    let (ok, text) = run(&["mlp_xnn_external.pte", "--input", "mlp.input.f32"]);
    assert!(!ok && text.contains("not found"), "missing .ptd: {text}");
    let (ok, text) = run(&["mlp_xnn_inline.pte", "--input", "cnn.input.f32"]);
    assert!(!ok && text.contains("bytes"), "wrong input size: {text}");
    let (ok, text) = run(&[
        "mlp_xnn_inline.pte",
        "--method",
        "nope",
        "--input",
        "mlp.input.f32",
    ]);
    assert!(!ok && text.contains("no method"), "{text}");
}
