//! XNNPACK's workspace (the memory runtimes plan their internal tensors in) and thread pool,
//! as owned handles that runtimes share.

use super::error::{check, XnnError};
use parking_lot::{Mutex, MutexGuard};
use std::ptr::NonNull;
use xnnpack_sys as sys;

/// A workspace several runtimes may share: their internal tensors then live in one arena
/// sized for the largest, instead of one each. Runtimes sharing it must not run at the same
/// time (a reshape of one moves the memory the others use), so each holds the workspace's lock
/// from its reshape to the end of its run.
pub struct Workspace {
    raw: NonNull<sys::xnn_workspace>,
    in_use: Mutex<()>,
}

// SAFETY: XNNPACK's workspace is plain memory plus a list of its runtimes; every use of it goes
// through a runtime holding `in_use`.
unsafe impl Send for Workspace {}
// SAFETY: as above.
unsafe impl Sync for Workspace {}

impl Workspace {
    /// Creates an empty workspace with `xnn_create_workspace`, initialising XNNPACK first.
    pub fn new() -> Result<Workspace, XnnError> {
        super::initialize()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("xnn_create_workspace", unsafe {
            sys::xnn_create_workspace(&mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or(XnnError::Call {
            call: "xnn_create_workspace",
            status: super::Status::OutOfMemory,
        })?;
        Ok(Workspace {
            raw,
            in_use: Mutex::new(()),
        })
    }

    pub(super) fn as_raw(&self) -> sys::xnn_workspace_t {
        self.raw.as_ptr()
    }

    /// Held by a runtime from its reshape to the end of its run.
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        self.in_use.lock()
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // SAFETY: XNNPACK reference-counts the workspace: runtimes created with it keep it alive
        // until they are deleted, whatever the order.
        unsafe { sys::xnn_release_workspace(self.raw.as_ptr()) };
    }
}

/// A pool of worker threads XNNPACK splits each operator across.
pub struct Threadpool {
    raw: NonNull<sys::pthreadpool>,
}

// SAFETY: pthreadpool is thread-safe: concurrent parallelize calls are serialised inside it.
unsafe impl Send for Threadpool {}
// SAFETY: as above.
unsafe impl Sync for Threadpool {}

impl Threadpool {
    /// A pool of `threads` threads (the caller's thread counts as one).
    pub fn new(threads: usize) -> Result<Threadpool, XnnError> {
        // SAFETY: pthreadpool_create has no preconditions; null means it failed.
        let raw =
            NonNull::new(unsafe { sys::pthreadpool_create(threads) }).ok_or(XnnError::Call {
                call: "pthreadpool_create",
                status: super::Status::OutOfMemory,
            })?;
        Ok(Threadpool { raw })
    }

    /// How many threads the pool splits operators across, the caller's included
    /// (`pthreadpool_get_threads_count`).
    pub fn threads(&self) -> usize {
        // SAFETY: the pool is valid.
        unsafe { sys::pthreadpool_get_threads_count(self.raw.as_ptr()) }
    }

    pub(super) fn as_raw(&self) -> sys::pthreadpool_t {
        self.raw.as_ptr()
    }
}

impl Drop for Threadpool {
    fn drop(&mut self) {
        // SAFETY: runtimes hold an Arc of the pool, so none that uses it is left.
        unsafe { sys::pthreadpool_destroy(self.raw.as_ptr()) };
    }
}
