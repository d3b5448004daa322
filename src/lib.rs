//! xnnblob: fast, lean on-device model loading for XNNPACK.
//!
//! - [`xnn`]: a small safe layer over XNNPACK (subgraphs, runtimes, weights-cache providers).
//! - [`named_data`]: ExecuTorch-compatible named data: `.ptd`/`.pte` readers, maps, the writer.
//! - [`shared_data`]: one shared copy of each named blob across a backend's models and methods.
//! - [`cache`]: the persistent packed-weight cache bridged to XNNPACK's weights-cache callbacks.
//! - [`deferred`]: constants whose bytes are read only if XNNPACK needs them (a cache miss).
//! - [`backend`]: the backend-wide object (shared data, packed-weight caches, workspace,
//!   threads) and the per-model context its delegates share.
//! - [`delegate`]: ExecuTorch's XNNPACK delegate: a processed payload becomes a runtime.
//! - [`program`], [`state`]: whole `.pte` programs run on XNNPACK, and stateful programs built
//!   by hand.
//! - [`schema`]: the flatbuffer schemas xnnblob reads, as flatc generates them.
//! - [`tensor`]: element types, shapes and tensor views at a delegate's boundary.
//! - [`link`]: a `.ptd`'s blobs compiled into the binary (by the `xnnblob-link` generator),
//!   served in place.
//! - [`aligned`], [`mmap`], [`sha256`]: aligned buffers, read-only file maps, content keys.
//!
//! The faces are crates of their own: `xnnblob-cxx` (C++), `xnnblob-capi` (C),
//! `xnnblob-executorch` (ExecuTorch's runtime) and `xnnblob-cli` (the command line). What only
//! tests, benches and the demo need (synthetic models, the payload builder, the program writer,
//! the fault injector) is `xnnblob-test-support`, which no library links.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod aligned;
#[cfg(feature = "xnnpack")]
pub mod backend;
pub mod cache;
#[cfg(feature = "xnnpack")]
pub mod deferred;
#[cfg(feature = "xnnpack")]
pub mod delegate;
pub mod fast_hash;
mod le;
pub mod link;
pub mod mmap;
pub mod named_data;
#[cfg(feature = "xnnpack")]
pub mod program;
mod publish;
pub mod report;
pub mod schema;
pub mod sha256;
#[cfg(feature = "xnnpack")]
pub mod shared_data;
mod side_file;
#[cfg(feature = "xnnpack")]
pub mod state;
pub mod storage;
#[cfg(feature = "xnnpack")]
pub mod tensor;
#[cfg(feature = "xnnpack")]
pub mod xnn;
