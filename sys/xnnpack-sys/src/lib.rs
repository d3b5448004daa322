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

/// The generated bindings: bindgen writes unsafe blocks (in its bitfield accessors) without the
/// SAFETY lines the workspace asks of hand-written code.
#[allow(clippy::undocumented_unsafe_blocks)]
mod bindings {
    #![allow(
        non_camel_case_types,
        non_upper_case_globals,
        non_snake_case,
        clippy::all
    )]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
pub use bindings::*;

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

#[cfg(xnnpack_kernel_info)]
unsafe extern "C" {
    /// The bytes of the workspace `runtime`'s intermediate tensors were planned into, or 0 before
    /// its first reshape.
    pub fn xnnblob_runtime_workspace_size(runtime: *const xnn_runtime) -> usize;
}

/// Without XNNPACK's internal headers (a user-provided build) no workspace can be read.
///
/// # Safety
/// Always safe: it touches no argument. `unsafe` only to match the shim's signature.
#[cfg(not(xnnpack_kernel_info))]
pub unsafe extern "C" fn xnnblob_runtime_workspace_size(_runtime: *const xnn_runtime) -> usize {
    0
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

/// Whether [`xnnblob_qd8_gemm_kernel`] can name kernels, and [`xnnblob_runtime_workspace_size`]
/// read workspaces, in this build.
pub const HAS_KERNEL_INFO: bool = cfg!(xnnpack_kernel_info);

/// The pthreadpool that XNNPACK calls (`src/pool.c`): a `pthreadpool_t` is a [`PoolHandle`], and
/// every `pthreadpool_parallelize_*` call becomes one [`PoolOps::run`] over a flat range of
/// items, so a pool is two functions, whoever implements them.
pub mod pool {
    /// What a `pthreadpool_t` points to: the pool's operations and the pool they are called
    /// with (`struct xnnblob_pool_handle`).
    pub use super::xnnblob_pool_handle as PoolHandle;
    /// What a pool does for XNNPACK (`struct xnnblob_pool_ops`): `threads`, the threads one call
    /// is split across, the caller's included (at least 1); `run`, which calls
    /// `range(job, thread, begin, end)` over sub-ranges covering `0..count` exactly once,
    /// `thread` below `threads(pool)` and distinct among concurrent calls, and returns when
    /// every call has returned (`flags` are pthreadpool's, `PTHREADPOOL_FLAG_*`).
    pub use super::xnnblob_pool_ops as PoolOps;
    /// Runs items `begin..end` of a job on the thread numbered `thread` (`xnnblob_pool_range_fn`;
    /// None only where C passes a null function).
    pub use super::xnnblob_pool_range_fn as RangeFn;
    /// The calling thread's floating-point state for a job, and its restoration.
    pub use super::{xnnblob_pool_enter, xnnblob_pool_leave};
}
