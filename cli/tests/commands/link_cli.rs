//! `xnnblob link` writes the Rust source of linked parameters.

use crate::common;

#[test]
fn link_writes_one_static_per_parameter_and_the_lookups() {
    // `link` makes its output directory itself.
    let scratch = common::scratch("link");
    let dir = scratch.join("out");
    let ptd = common::repo_root().join("tests/data/executorch/mlp_portable_external.ptd");
    let out = crate::xnnblob()
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
        rs.matches("#[unsafe(link_section = \".xnnblob_params\")]")
            .count(),
        6
    );
    assert!(rs.contains("pub fn lookup_linked_param(id: u32)"));
    assert!(rs.contains("(\"layers.0.weight\", 0)"));
    assert!(rs.contains("extern \"C\" fn xnnblob_mlp_portable_external_lookup_linked_param"));
    assert!(rs.contains("pub static XNNBLOB_MLP_PORTABLE_EXTERNAL_PARAM_0:"));
    assert_eq!(
        std::fs::metadata(dir.join("param_0.bin")).unwrap().len(),
        65536
    );
    let bad = crate::xnnblob()
        .args(["link", "Cargo.toml", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

#[test]
fn a_key_cannot_inject_code_into_the_generated_source() {
    let dir = common::scratch("link-inject");
    let hostile = "w\npub fn injected() {}\n// \"quoted\" \\ tail";
    let mut store = xnnblob::named_data::NamedBlobStore::new();
    store
        .add_named_blob(hostile, &[1u8; 64], 16, "m", None)
        .unwrap();
    let ptd = dir.join("9 odd-name.ptd");
    store.write_ptd("m", &ptd).unwrap();
    let rs = xnnblob_link::generate(&ptd, &dir.join("out")).unwrap();
    let rs = std::fs::read_to_string(rs).unwrap();
    assert!(
        !rs.lines()
            .any(|l| l.trim_start().starts_with("pub fn injected")),
        "the key's newline ended a line:\n{rs}"
    );
    assert!(rs.contains(r#""w\npub fn injected() {}\n// \"quoted\" \\ tail""#));
    // A stem that is not an identifier still gives valid, distinct symbol names.
    assert!(rs.contains("XNNBLOB_M9_ODD_NAME_PARAM_0"));
    assert!(rs.contains("fn xnnblob_m9_odd_name_lookup_linked_param"));
}
