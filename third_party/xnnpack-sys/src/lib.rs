//! Raw, bindgen-generated bindings to XNNPACK (`xnn_*` functions and types, `XNN_*` constants).
//!
//! The build script provides the library: see its module docs for where XNNPACK comes from.
//! Safe wrappers live in the `xnnblob` crate, not here.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
