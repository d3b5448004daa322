//! What a format-only user compiles: `default-features = false` brings no XNNPACK, no C++ and no
//! command-line or plotting crates.

use std::process::Command;

#[test]
fn the_format_layer_alone_pulls_no_xnnpack_cxx_or_cli_crates() {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "tree",
            "--offline",
            "-p",
            "xnnblob",
            "--no-default-features",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--manifest-path",
        ])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"xnnblob"), "{tree}");
    for heavy in [
        "xnnpack-sys",
        "cxx",
        "cxx-build",
        "cc",
        "bindgen",
        "clap",
        "plotters",
        "indicatif",
    ] {
        assert!(!crates.contains(&heavy), "{heavy} in:\n{tree}");
    }
}
