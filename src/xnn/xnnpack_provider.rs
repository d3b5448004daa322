//! XNNPACK's own in-memory weights cache (`xnn_create_weights_cache`), for comparison: its
//! `look_up` never hits by key, it only deduplicates identical packed bytes within a process.

use super::error::{XnnError, check};
use super::weights_provider::AsXnnWeightsCache;
use std::ptr::NonNull;
use xnnpack_sys as sys;

/// XNNPACK's built-in weights cache (`xnn_create_weights_cache`), owned and deleted on drop;
/// kept as the baseline the packed-weight caches are compared with.
pub struct XnnpackWeightsCache {
    raw: NonNull<sys::xnn_weights_cache_provider>,
}

// SAFETY: XNNPACK's cache guards its state with its own mutex; the handle is owned here.
unsafe impl Send for XnnpackWeightsCache {}
// SAFETY: as above.
unsafe impl Sync for XnnpackWeightsCache {}

impl XnnpackWeightsCache {
    /// Creates an empty cache with `xnn_create_weights_cache`, initialising XNNPACK first.
    pub fn new() -> Result<XnnpackWeightsCache, XnnError> {
        super::initialize()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("xnn_create_weights_cache", unsafe {
            sys::xnn_create_weights_cache(&mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or(XnnError::Call {
            call: "xnn_create_weights_cache",
            status: super::Status::OutOfMemory,
        })?;
        Ok(XnnpackWeightsCache { raw })
    }

    /// Soft finalization: runtimes can be set up, and later runtimes can still add weights.
    pub fn finalize(&self) -> Result<(), XnnError> {
        // SAFETY: the cache is valid.
        check("xnn_finalize_weights_cache", unsafe {
            sys::xnn_finalize_weights_cache(
                self.raw.as_ptr(),
                sys::xnn_weights_cache_finalization_kind_soft,
            )
        })
    }
}

// SAFETY: the cache lives until self is dropped, and XNNPACK's callbacks are thread-safe.
unsafe impl AsXnnWeightsCache for XnnpackWeightsCache {
    fn as_xnn_weights_cache(&self) -> sys::xnn_weights_cache_t {
        self.raw.as_ptr()
    }
}

impl Drop for XnnpackWeightsCache {
    fn drop(&mut self) {
        // SAFETY: owned; runtimes borrowing it are gone (they borrow self).
        unsafe { sys::xnn_delete_weights_cache(self.raw.as_ptr()) };
    }
}
