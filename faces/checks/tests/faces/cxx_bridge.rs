//! The C++ side is compiled, linked, and reaches both Rust and XNNPACK.

#[test]
fn cpp_describe_reaches_rust_and_xnnpack() {
    // Fallible only where C++ cannot allocate the line.
    let line = xnnblob_cxx::ffi::describe().expect("describe assembles its line");
    assert!(line.starts_with(&format!(
        "xnnblob {} on XNNPACK build ",
        env!("CARGO_PKG_VERSION")
    )));
    let hex: String = xnnblob::xnn::build_identifier()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(hex.len(), 64, "a 32-byte build identifier");
    assert!(line.contains(&hex), "{line}");
    assert!(line.ends_with("(32-byte identifier)"), "{line}");
}
