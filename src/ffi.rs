//! The cxx bridge: what C++ sees of xnnblob.

#[cxx::bridge(namespace = "xnnblob")]
mod bridge {
    extern "Rust" {
        /// xnnblob's version.
        fn version() -> &'static str;
        /// The linked XNNPACK's build identifier as lowercase hex.
        fn xnnpack_build_identifier() -> String;
    }

    unsafe extern "C++" {
        include!("xnnblob/xnnblob.h");

        /// One line naming xnnblob and XNNPACK, assembled in C++.
        fn describe() -> String;
    }
}

pub use bridge::describe;

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

fn xnnpack_build_identifier() -> String {
    crate::xnn::build_identifier()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
