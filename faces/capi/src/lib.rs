//! xnnblob's C face. [`capi`] is the C ABI (declared in `include/xnnblob.h`); this crate builds
//! it as the installable libraries `libxnnblob.a` and `libxnnblob.so`. The static library also
//! holds everything a C++ consumer of `xnnblob/delegate.h` and a raw XNNPACK user link against:
//! the C++ delegate API (`xnnblob-cxx`), XNNPACK and pthreadpool. The shared one exports the C
//! ABI, and keeps its XNNPACK private.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod capi;

// Named so that it is linked: the static library carries the C++ delegate API (its C++ objects
// and the bridge's Rust side), which nothing in this crate calls.
extern crate xnnblob_cxx;
