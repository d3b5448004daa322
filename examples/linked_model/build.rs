//! Links the weights of ExecuTorch's `mlp_xnn_external` program into this crate, and those of
//! `mlp_portable_external` beside them: two models in one binary, whose symbols must not clash.
use std::path::{Path, PathBuf};

fn main() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/executorch");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for (model, dir) in [
        ("mlp_xnn_external", "params"),
        ("mlp_portable_external", "second"),
    ] {
        let ptd = data.join(format!("{model}.ptd"));
        xnnblob_link::generate(&ptd, &out.join(dir)).expect("linked parameters");
        println!("cargo:rerun-if-changed={}", ptd.display());
    }
}
