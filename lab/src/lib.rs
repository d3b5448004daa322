//! `xnnblob-lab`'s library: the demo, the benchmarks and the crash torture, apart from the
//! installed `xnnblob` command line.
//!
//! - [`bench`](mod@bench): the load benchmark, the peer benchmark against ExecuTorch's own
//!   backend, and the demo.
//! - [`torture`]: kill -9 at random points of cold launches, then check every cache file left.
//!
//! The models they launch come from [`xnnblob_test_support::synthetic::model`].
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod bench;
pub mod torture;
