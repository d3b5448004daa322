//! Links the weights of ExecuTorch's `mlp_xnn_external` program into this crate.
use std::path::{Path, PathBuf};

fn main() {
    let ptd = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/executorch/mlp_xnn_external.ptd");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    xnnblob::link::generate(&ptd, &out).expect("linked parameters");
    println!("cargo:rerun-if-changed={}", ptd.display());
}
