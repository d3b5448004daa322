//! The load benchmark (`xnnblob bench`, `cargo bench --bench load`) and the demo
//! (`xnnblob demo`): synthetic ExecuTorch-style models, each launch in a fresh child process,
//! XNNPACK without a cache, with its own cache, xnnblob cold and warm, and the floor side by
//! side; a markdown table and an SVG chart in `target/bench/`.

#[cfg(feature = "cli")]
pub mod child;
#[cfg(feature = "cli")]
pub mod compare;
pub mod model;
#[cfg(feature = "cli")]
pub mod peer;
#[cfg(feature = "cli")]
pub mod report;
#[cfg(feature = "cli")]
mod runner;
#[cfg(feature = "cli")]
pub use runner::*;
