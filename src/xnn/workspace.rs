//! XNNPACK's workspace (the memory runtimes plan their internal tensors in), as an owned handle
//! that runtimes share.

use super::error::{XnnError, check};
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
