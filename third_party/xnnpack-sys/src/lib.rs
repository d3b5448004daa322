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

#[cfg(xnnpack_kernel_info)]
unsafe extern "C" {
    /// Writes the name of the widest-tile GEMM microkernel XNNPACK's configuration picked on this
    /// CPU for qd8 activations with `weights` (0: qc8w, 1: qc4w, 2: qb4w) into `buffer` (NUL
    /// terminated, truncated to `size`). Returns 0, or -1 for an unknown weight type, a config
    /// this CPU has none of, or an XNNPACK not built by this crate (see [`HAS_KERNEL_INFO`]).
    pub fn xnnblob_qd8_gemm_kernel(
        weights: core::ffi::c_int,
        buffer: *mut core::ffi::c_char,
        size: usize,
    ) -> core::ffi::c_int;
}

/// Without XNNPACK's internal headers (a user-provided build) no kernel can be named.
///
/// # Safety
/// Always safe: it touches neither argument. `unsafe` only to match the shim's signature.
#[cfg(not(xnnpack_kernel_info))]
pub unsafe extern "C" fn xnnblob_qd8_gemm_kernel(
    _weights: core::ffi::c_int,
    _buffer: *mut core::ffi::c_char,
    _size: usize,
) -> core::ffi::c_int {
    -1
}

/// Whether [`xnnblob_qd8_gemm_kernel`] can name kernels in this build.
pub const HAS_KERNEL_INFO: bool = cfg!(xnnpack_kernel_info);
