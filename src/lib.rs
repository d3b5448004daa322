//! xnnblob: fast, lean on-device model loading for XNNPACK.
//!
//! - [`xnn`]: a small safe layer over XNNPACK (subgraphs, runtimes, weights-cache providers).
//! - [`synthetic`]: deterministic models with Rust references, for the demo, tests and benches.
//! - [`named_data`]: ExecuTorch-compatible named data: `.ptd`/`.pte` readers, maps, the writer.
//! - [`shared_cache`]: one shared copy of each named blob across a backend's models and methods.
//! - [`cache`]: the persistent packed-weight cache bridged to XNNPACK's weights-cache callbacks.
//! - [`ffi`]: the cxx bridge that C++ reaches xnnblob through.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod aligned;
pub mod backend;
pub mod bench;
pub mod cache;
pub mod deferred;
pub mod delegate;
mod fast_hash;
pub mod ffi;
pub mod inspect;
pub mod link;
pub mod mmap;
pub mod named_data;
pub mod program;
pub mod program_writer;
mod schema;
pub mod sha256;
pub mod shared_cache;
pub mod state;
pub mod synthetic;
pub mod tensor;
pub mod xnn;
