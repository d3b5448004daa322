//! xnnblob's C ABI (`include/xnnblob.h`): the packed-weight cache as an `xnn_weights_cache_t`
//! for C programs and other XNNPACK front ends that take one (LiteRT's XNNPACK delegate, raw
//! XNNPACK users).
//!
//! Every call returns an [`XnnblobStatus`]; on failure the message is kept per thread for
//! [`xnnblob_last_error`]. Null pointers and misuse are errors, never crashes, and no panic
//! crosses the boundary (it becomes [`XnnblobStatus::Internal`]).

use crate::cache::{BlobId, CacheError, PackedWeightsCache};
use crate::xnn::AsXnnWeightsCache;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// What a C call did.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XnnblobStatus {
    /// It succeeded.
    Ok = 0,
    /// A pointer was null, a string not UTF-8, or an argument out of range.
    InvalidArgument = 1,
    /// A file could not be read or written.
    Io = 2,
    /// A file's contents were rejected.
    InvalidFormat = 3,
    /// A panic inside xnnblob (a bug): the call did nothing it reported.
    Internal = 4,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(status: XnnblobStatus, message: impl Into<String>) -> XnnblobStatus {
    let text = CString::new(message.into().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    status
}

fn cache_status(error: CacheError) -> XnnblobStatus {
    let status = match &error {
        CacheError::Io { .. } => XnnblobStatus::Io,
        _ => XnnblobStatus::InvalidFormat,
    };
    fail(status, error.to_string())
}

/// Runs `body`, turning a panic into [`XnnblobStatus::Internal`] with its message.
fn guarded(body: impl FnOnce() -> XnnblobStatus) -> XnnblobStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(XnnblobStatus::Internal, format!("internal error: {what}"))
        }
    }
}

/// The message of the last failed call on this thread ("" if none). Valid until the next call
/// on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn xnnblob_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A packed-weight cache handle for C.
pub struct XnnblobCache {
    cache: Arc<PackedWeightsCache>,
}

/// Counters of a cache, for C.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct XnnblobCacheStats {
    /// XNNPACK look-ups that found packed weights.
    pub hits: u64,
    /// XNNPACK look-ups that found none (XNNPACK packed them next).
    pub misses: u64,
    /// Weights XNNPACK packed in this process.
    pub packed: u64,
    /// Entries the cache holds (from its file and packed here).
    pub entries: u64,
    /// Total size in bytes of the packed weights it holds.
    pub packed_bytes: u64,
}

fn open(
    out: *mut *mut XnnblobCache,
    make: impl FnOnce() -> Result<Arc<PackedWeightsCache>, XnnblobStatus>,
) -> XnnblobStatus {
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| match make() {
        Ok(cache) => {
            let handle = Box::into_raw(Box::new(XnnblobCache { cache }));
            // SAFETY: `out` is non-null and, per the header, points to writable storage.
            unsafe { *out = handle };
            XnnblobStatus::Ok
        }
        Err(status) => status,
    })
}

/// Opens the cache kept in the file at `path` (created by the first save). A file already open
/// in this process is shared. `*out` receives the handle, to [`xnnblob_cache_close`].
///
/// # Safety
/// `path` is null or a NUL-terminated string; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_open_file(
    path: *const c_char,
    out: *mut *mut XnnblobCache,
) -> XnnblobStatus {
    if path.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "path is null");
    }
    // SAFETY: non-null, NUL-terminated per the contract.
    let path = unsafe { CStr::from_ptr(path) };
    let Ok(path) = path.to_str() else {
        return fail(XnnblobStatus::InvalidArgument, "path is not UTF-8");
    };
    open(out, || PackedWeightsCache::open(path).map_err(cache_status))
}

/// Opens a cache that lives in memory only, for this process.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_open_memory(out: *mut *mut XnnblobCache) -> XnnblobStatus {
    open(out, || Ok(PackedWeightsCache::in_memory()))
}

/// The cache as XNNPACK's `xnn_weights_cache_t`, for `xnn_create_runtime_v4`; valid until
/// [`xnnblob_cache_close`]. Null for a null handle.
///
/// # Safety
/// `cache` is null or a handle from an open call, not yet closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_xnn(cache: *mut XnnblobCache) -> *mut c_void {
    // SAFETY: null or a live handle, per the contract.
    match unsafe { cache.as_ref() } {
        Some(handle) => handle.cache.as_xnn_weights_cache().cast(),
        None => std::ptr::null_mut(),
    }
}

/// Declares that the `size` bytes at `data`, about to be handed to XNNPACK as a filter or bias,
/// are the blob `sha256` (32 bytes: the SHA-256 of those bytes, as ExecuTorch keys them) or, if
/// `sha256` is null, hashes them now. A packed weight is then found by content in any later
/// process. The bytes must stay valid and unchanged until [`xnnblob_cache_unregister`].
///
/// # Safety
/// `cache` is null or a live handle; `data` is null or valid for `size` bytes; `sha256` is null
/// or valid for 32 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_register(
    cache: *mut XnnblobCache,
    data: *const c_void,
    size: usize,
    sha256: *const u8,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let Some(handle) = (unsafe { cache.as_ref() }) else {
        return fail(XnnblobStatus::InvalidArgument, "cache is null");
    };
    if data.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "data is null");
    }
    guarded(|| {
        let id = if sha256.is_null() {
            // SAFETY: `data` is valid for `size` bytes, per the contract.
            let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) };
            BlobId::of_bytes(bytes)
        } else {
            let mut digest = [0u8; 32];
            // SAFETY: `sha256` is valid for 32 bytes, per the contract.
            digest.copy_from_slice(unsafe { std::slice::from_raw_parts(sha256, 32) });
            BlobId(digest)
        };
        handle.cache.register_raw(data.cast(), id);
        XnnblobStatus::Ok
    })
}

/// Ends the registration of `data` (after the runtimes that packed from it were created).
///
/// # Safety
/// `cache` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_unregister(
    cache: *mut XnnblobCache,
    data: *const c_void,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let Some(handle) = (unsafe { cache.as_ref() }) else {
        return fail(XnnblobStatus::InvalidArgument, "cache is null");
    };
    guarded(|| {
        handle.cache.unregister_raw(data.cast());
        XnnblobStatus::Ok
    })
}

/// Call after creating runtimes and before setting them up: enables setup and saves what was
/// packed (in the background; see [`xnnblob_cache_wait_saved`]).
///
/// # Safety
/// `cache` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_finalize(cache: *mut XnnblobCache) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let Some(handle) = (unsafe { cache.as_ref() }) else {
        return fail(XnnblobStatus::InvalidArgument, "cache is null");
    };
    guarded(|| match handle.cache.finalize() {
        Ok(()) => XnnblobStatus::Ok,
        Err(e) => cache_status(e),
    })
}

/// Waits until the last save is durable on disk; reports its error, if any.
///
/// # Safety
/// `cache` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_wait_saved(cache: *mut XnnblobCache) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let Some(handle) = (unsafe { cache.as_ref() }) else {
        return fail(XnnblobStatus::InvalidArgument, "cache is null");
    };
    guarded(|| match handle.cache.wait_saved() {
        Ok(()) => XnnblobStatus::Ok,
        Err(e) => cache_status(e),
    })
}

/// The cache's counters.
///
/// # Safety
/// `cache` is null or a live handle; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_get_stats(
    cache: *const XnnblobCache,
    out: *mut XnnblobCacheStats,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let Some(handle) = (unsafe { cache.as_ref() }) else {
        return fail(XnnblobStatus::InvalidArgument, "cache is null");
    };
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| {
        let s = handle.cache.stats();
        let stats = XnnblobCacheStats {
            hits: s.hits as u64,
            misses: s.misses as u64,
            packed: s.packed as u64,
            entries: s.entries as u64,
            packed_bytes: s.packed_bytes as u64,
        };
        // SAFETY: `out` is non-null and writable, per the contract.
        unsafe { *out = stats };
        XnnblobStatus::Ok
    })
}

/// Closes a handle (null is allowed). Runtimes created with the cache must be deleted first.
///
/// # Safety
/// `cache` is null or a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_close(cache: *mut XnnblobCache) {
    if cache.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: a live handle from Box::into_raw, closed once, per the contract.
        drop(unsafe { Box::from_raw(cache) });
    }));
}
