//! xnnblob: fast, lean on-device model loading for XNNPACK.
//!
//! - [`xnn`]: a small safe layer over XNNPACK (subgraphs, runtimes, weights-cache providers).
//! - [`synthetic`]: deterministic models with Rust references, for the demo, tests and benches.
//! - [`ffi`]: the cxx bridge that C++ reaches xnnblob through.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod ffi;
pub mod synthetic;
pub mod xnn;
