//! The load benchmark (`xnnblob-lab bench`, `cargo bench --bench load`) and the demo
//! (`xnnblob-lab demo`): synthetic ExecuTorch-style models, each launch in a fresh child process,
//! XNNPACK without a cache, with its own cache, xnnblob cold and warm, and the floor side by
//! side; a markdown table and an SVG chart in `target/bench/`.

pub mod amx_refused;
pub mod child;
pub mod compare;
pub mod peer;
pub mod prefill;
pub mod report;
mod runner;
pub use runner::*;
