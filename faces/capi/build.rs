//! Records where the headers an install needs were generated or found, for
//! `scripts/install.sh`: the cxx bridge's (`rust/cxx.h`, `xnnblob/src/ffi.rs.h`) and XNNPACK's,
//! and the XNNPACK version the install records.

use std::env;
use std::path::PathBuf;

fn main() {
    let cxxbridge = env::var("DEP_XNNBLOB_CXXBRIDGE_DIR0").expect("xnnblob publishes its headers");
    let xnnpack = env::var("DEP_XNNPACK_INCLUDE").expect("xnnpack-sys publishes its headers");
    let xnnpack_version = env::var("DEP_XNNPACK_VERSION").expect("xnnpack-sys says its version");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = format!(
        "cxxbridge_include={cxxbridge}\nxnnpack_include={xnnpack}\nxnnpack_version={xnnpack_version}\n"
    );
    std::fs::write(out.join("install-headers.txt"), manifest).expect("writing OUT_DIR");
    println!("cargo:rerun-if-env-changed=DEP_XNNBLOB_CXXBRIDGE_DIR0");
    println!("cargo:rerun-if-env-changed=DEP_XNNPACK_INCLUDE");
    println!("cargo:rerun-if-env-changed=DEP_XNNPACK_VERSION");
}
