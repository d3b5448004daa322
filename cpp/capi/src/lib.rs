//! The installable xnnblob libraries: `libxnnblob.a` and `libxnnblob.so` export the C ABI of
//! `xnnblob::capi` (declared in `cpp/include/xnnblob.h`). The static library also holds
//! everything a C++ consumer of `xnnblob/delegate.h` and a raw XNNPACK user link against: the
//! C++ delegate API, XNNPACK and pthreadpool. The shared one exports the C ABI only, so its
//! XNNPACK stays private.

// The C ABI's functions are `#[no_mangle]` in the xnnblob crate; naming one keeps the crate
// linked into both libraries.
pub use xnnblob::capi::xnnblob_last_error;
