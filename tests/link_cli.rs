//! `xnnblob link` writes the Rust source of linked parameters.

use std::process::Command;

#[test]
fn link_writes_one_static_per_parameter_and_the_lookups() {
    let dir = std::env::temp_dir().join(format!("xnnblob-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ptd = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/executorch/mlp_portable_external.ptd");
    let out = Command::new(env!("CARGO_BIN_EXE_xnnblob"))
        .arg("link")
        .arg(&ptd)
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rs = std::fs::read_to_string(dir.join("linked_params.rs")).unwrap();
    assert_eq!(
        rs.matches("#[link_section = \".xnnblob_params\"]").count(),
        6
    );
    assert!(rs.contains("pub fn lookup_linked_param(id: u32)"));
    assert!(rs.contains("(\"layers.0.weight\", 0)"));
    assert!(rs.contains("extern \"C\" fn xnnblob_lookup_linked_param"));
    assert_eq!(
        std::fs::metadata(dir.join("param_0.bin")).unwrap().len(),
        65536
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_xnnblob"))
        .args(["link", "Cargo.toml", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
