//! xnnblob's C ABI (`include/xnnblob.h`): the packed-weight cache as an `xnn_weights_cache_t`
//! for C programs and other XNNPACK front ends that take one (LiteRT's XNNPACK delegate, raw
//! XNNPACK users), ExecuTorch named data (`.ptd`, `.pte`) read zero-copy, and the backend object
//! that owns a process's caches.
//!
//! Every call returns an [`XnnblobStatus`]; on failure the message is kept per thread for
//! [`xnnblob_last_error`]. Null pointers and misuse are errors, never crashes, and no panic
//! crosses the boundary (it becomes [`XnnblobStatus::Internal`]).

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use xnnblob::backend::{Backend, BackendError, BackendOptions};
use xnnblob::cache::{BlobId, CacheError, PackedWeightsCache};
use xnnblob::named_data::{DataBuffer, FileDataMap, NamedDataError, NamedDataMap};
use xnnblob::xnn::AsXnnWeightsCache;

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
    /// No entry has the key, or an index is past the last key.
    NotFound = 5,
    /// XNNPACK refused a call (initialisation, a thread pool, a workspace).
    Xnnpack = 6,
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
    fail(status, xnnblob::report::report(&error))
}

/// The value of a `Result` whose error is the status to return from the C call.
macro_rules! try_arg {
    ($result:expr_2021) => {
        match $result {
            Ok(value) => value,
            Err(status) => return status,
        }
    };
}

/// A handle argument as a reference, or `InvalidArgument` when it is null.
///
/// # Safety
/// `handle` is null or points to a live handle for the returned lifetime.
unsafe fn live<'a, T>(handle: *const T, what: &str) -> Result<&'a T, XnnblobStatus> {
    // SAFETY: null or live, per the caller's contract.
    unsafe { handle.as_ref() }
        .ok_or_else(|| fail(XnnblobStatus::InvalidArgument, format!("{what} is null")))
}

/// Frees a handle made by `Box::into_raw` (null is allowed); a panic in its drop stays here.
///
/// # Safety
/// `handle` is null or a live handle from `Box::into_raw`, not used again.
unsafe fn free_handle<T>(handle: *mut T) {
    if handle.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: a live handle from Box::into_raw, freed once, per the caller's contract.
        drop(unsafe { Box::from_raw(handle) });
    }));
}

/// Runs `body`, turning a panic into [`XnnblobStatus::Internal`] with its message: the panic
/// policy every C entry point holds to. Public so that code adding entry points (the C checks)
/// holds to it too.
pub fn guarded(body: impl FnOnce() -> XnnblobStatus) -> XnnblobStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(panic) => fail(
            XnnblobStatus::Internal,
            format!(
                "internal error: {}",
                xnnblob::report::panic_message(&*panic)
            ),
        ),
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
/// in this process is shared. `*out` receives the handle, to [`xnnblob_cache_close`]. The C ABI
/// is given weights as bytes, not the files they came from, so the files the cache creates are
/// readable and writable by their owner alone (0600).
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
    open(out, || {
        let cache = PackedWeightsCache::open(path).map_err(cache_status)?;
        cache.limit_permissions(xnnblob::cache::PRIVATE_MODE);
        Ok(cache)
    })
}

/// Opens the cache kept in the file at `path` under `layer_count` read-only layers (`layers`:
/// cache files or directories of them, made ahead of time by `xnnblob prepack`), consulted first,
/// in order; only what no layer of this CPU's class holds is packed, into `path`. Layers are
/// never written.
///
/// # Safety
/// `path` is null or NUL-terminated; `layers` is null (with `layer_count` 0) or points to
/// `layer_count` pointers, each null or NUL-terminated; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_open_layered(
    path: *const c_char,
    layers: *const *const c_char,
    layer_count: usize,
    out: *mut *mut XnnblobCache,
) -> XnnblobStatus {
    if path.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "path is null");
    }
    if layers.is_null() && layer_count > 0 {
        return fail(XnnblobStatus::InvalidArgument, "layers is null");
    }
    // SAFETY: non-null, NUL-terminated per the contract.
    let Ok(path) = unsafe { CStr::from_ptr(path) }.to_str() else {
        return fail(XnnblobStatus::InvalidArgument, "path is not UTF-8");
    };
    let mut paths = Vec::with_capacity(layer_count);
    for i in 0..layer_count {
        // SAFETY: `layers` points to `layer_count` pointers per the contract.
        let layer = unsafe { *layers.add(i) };
        if layer.is_null() {
            return fail(XnnblobStatus::InvalidArgument, format!("layer {i} is null"));
        }
        // SAFETY: non-null, NUL-terminated per the contract.
        let Ok(layer) = unsafe { CStr::from_ptr(layer) }.to_str() else {
            return fail(
                XnnblobStatus::InvalidArgument,
                format!("layer {i} is not UTF-8"),
            );
        };
        paths.push(std::path::PathBuf::from(layer));
    }
    open(out, || {
        let options = xnnblob::cache::CacheOptions {
            layers: paths,
            ..Default::default()
        };
        let cache = PackedWeightsCache::open_with(path, options).map_err(cache_status)?;
        cache.limit_permissions(xnnblob::cache::PRIVATE_MODE);
        if let Some(note) = cache.layer_note() {
            eprintln!("xnnblob: {note}");
        }
        Ok(cache)
    })
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
/// The identity is the bytes alone: XNNPACK's look-up seed (patched to state every packing
/// parameter: operator, shapes, tiling) tells the same bytes packed in two shapes apart. An
/// address holds one identity at a time: registering it again under another fails with
/// `XNNBLOB_INVALID_ARGUMENT`.
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
    let handle = try_arg!(unsafe { live(cache, "cache") });
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
        if handle.cache.register_raw(data.cast(), id) {
            XnnblobStatus::Ok
        } else {
            fail(
                XnnblobStatus::InvalidArgument,
                "data is registered under another identity: give each tensor's bytes an \
                 address of their own while both are registered",
            )
        }
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
    let handle = try_arg!(unsafe { live(cache, "cache") });
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
    let handle = try_arg!(unsafe { live(cache, "cache") });
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
    let handle = try_arg!(unsafe { live(cache, "cache") });
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
    let handle = try_arg!(unsafe { live(cache, "cache") });
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

/// How many of the cache's maps found their file cut short (see
/// [`PackedWeightsCache::lost_maps`]), in `*out`.
///
/// # Safety
/// `cache` is null or a live handle; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_lost_maps(
    cache: *const XnnblobCache,
    out: *mut usize,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(cache, "cache") });
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| {
        let lost = handle.cache.lost_maps();
        // SAFETY: `out` is non-null and writable, per the contract.
        unsafe { *out = lost };
        XnnblobStatus::Ok
    })
}

/// Closes a handle (null is allowed). Runtimes created with the cache must be deleted first.
///
/// # Safety
/// `cache` is null or a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_cache_close(cache: *mut XnnblobCache) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(cache) }
}

fn map_status(error: NamedDataError) -> XnnblobStatus {
    let status = match &error {
        NamedDataError::Io { .. } => XnnblobStatus::Io,
        NamedDataError::Format { .. } => XnnblobStatus::InvalidFormat,
        NamedDataError::KeyNotFound { .. } | NamedDataError::IndexOutOfRange { .. } => {
            XnnblobStatus::NotFound
        }
        _ => XnnblobStatus::InvalidArgument,
    };
    fail(status, xnnblob::report::report(&error))
}

/// A C string argument as `&str`, or the status to return.
///
/// # Safety
/// `text` is null or NUL-terminated and valid for the returned lifetime.
unsafe fn text_arg<'a>(text: *const c_char, what: &str) -> Result<&'a str, XnnblobStatus> {
    if text.is_null() {
        return Err(fail(
            XnnblobStatus::InvalidArgument,
            format!("{what} is null"),
        ));
    }
    // SAFETY: non-null and NUL-terminated, per the caller's contract.
    unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| {
        fail(
            XnnblobStatus::InvalidArgument,
            format!("{what} is not UTF-8"),
        )
    })
}

/// An open named-data file for C: the map and its keys as C strings (made once, at open, so
/// `xnnblob_map_key_at` hands out pointers that live as long as the map).
pub struct XnnblobMap {
    map: FileDataMap,
    keys: Vec<CString>,
}

/// One blob's bytes for C, in place in the mapped file; the map stays open while it lives.
pub struct XnnblobBuffer {
    data: DataBuffer,
}

/// A tensor layout for C: the dtype code and sizes ExecuTorch stored with a blob.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct XnnblobLayout {
    /// ExecuTorch's scalar type code (6: float32, 5: float16, 1: int8, ...).
    pub scalar_type: i8,
    /// How many of `sizes` and `dim_order` are used.
    pub num_dims: u32,
    /// The size of each dimension, outermost first.
    pub sizes: [i32; 16],
    /// The memory order of the dimensions, outermost first.
    pub dim_order: [u8; 16],
}

/// Opens an ExecuTorch `.ptd` or `.pte` file (told apart by its contents): mapped, validated,
/// nothing copied. `*out` receives the handle, to [`xnnblob_map_close`].
///
/// # Safety
/// `path` is null or NUL-terminated; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_open(
    path: *const c_char,
    out: *mut *mut XnnblobMap,
) -> XnnblobStatus {
    // SAFETY: forwarded contract.
    let path = try_arg!(unsafe { text_arg(path, "path") });
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| {
        let map = match FileDataMap::open(path) {
            Ok(map) => map,
            Err(e) => return map_status(e),
        };
        let mut keys = Vec::with_capacity(map.num_keys());
        for i in 0..map.num_keys() {
            match map.key_at(i).map(CString::new) {
                Ok(Ok(key)) => keys.push(key),
                Ok(Err(_)) => {
                    return fail(
                        XnnblobStatus::InvalidFormat,
                        format!("{path}: key {i} holds a NUL byte"),
                    );
                }
                Err(e) => return map_status(e),
            }
        }
        let handle = Box::into_raw(Box::new(XnnblobMap { map, keys }));
        // SAFETY: `out` is non-null and writable, per the contract.
        unsafe { *out = handle };
        XnnblobStatus::Ok
    })
}

/// The number of keys.
///
/// # Safety
/// `map` is null or a live handle; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_num_keys(
    map: *const XnnblobMap,
    out: *mut usize,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(map, "map") });
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    // SAFETY: non-null and writable, per the contract.
    unsafe { *out = handle.keys.len() };
    XnnblobStatus::Ok
}

/// The key at `index` (below the key count), NUL-terminated, valid while the map is open.
///
/// # Safety
/// `map` is null or a live handle; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_key_at(
    map: *const XnnblobMap,
    index: usize,
    out: *mut *const c_char,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(map, "map") });
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    let Some(key) = handle.keys.get(index) else {
        return map_status(NamedDataError::IndexOutOfRange {
            index,
            len: handle.keys.len(),
        });
    };
    // SAFETY: non-null and writable, per the contract.
    unsafe { *out = key.as_ptr() };
    XnnblobStatus::Ok
}

/// `key`'s bytes, in place: `*out` receives a buffer handle, to [`xnnblob_buffer_release`].
///
/// # Safety
/// `map` is null or a live handle; `key` is null or NUL-terminated; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_get_data(
    map: *const XnnblobMap,
    key: *const c_char,
    out: *mut *mut XnnblobBuffer,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(map, "map") });
    // SAFETY: forwarded contract.
    let key = try_arg!(unsafe { text_arg(key, "key") });
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| match handle.map.get_data(key) {
        Ok(data) => {
            let buffer = Box::into_raw(Box::new(XnnblobBuffer { data }));
            // SAFETY: non-null and writable, per the contract.
            unsafe { *out = buffer };
            XnnblobStatus::Ok
        }
        Err(e) => map_status(e),
    })
}

/// A buffer's first byte (null for a null buffer).
///
/// # Safety
/// `buffer` is null or a live buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_buffer_data(buffer: *const XnnblobBuffer) -> *const c_void {
    // SAFETY: null or a live handle, per the contract.
    unsafe { buffer.as_ref() }.map_or(std::ptr::null(), |b| b.data.as_ptr().cast())
}

/// A buffer's length in bytes (0 for a null buffer).
///
/// # Safety
/// `buffer` is null or a live buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_buffer_size(buffer: *const XnnblobBuffer) -> usize {
    // SAFETY: null or a live handle, per the contract.
    unsafe { buffer.as_ref() }.map_or(0, |b| b.data.len())
}

/// Releases a buffer (null is allowed); its bytes may be unmapped once no buffer or map holds
/// them.
///
/// # Safety
/// `buffer` is null or a live buffer handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_buffer_release(buffer: *mut XnnblobBuffer) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(buffer) }
}

/// Copies `key`'s bytes into `destination`, which holds exactly `size` bytes (the blob's size).
///
/// # Safety
/// `map` is null or a live handle; `key` is null or NUL-terminated; `destination` is null or
/// writable for `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_load_into(
    map: *const XnnblobMap,
    key: *const c_char,
    destination: *mut c_void,
    size: usize,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(map, "map") });
    // SAFETY: forwarded contract.
    let key = try_arg!(unsafe { text_arg(key, "key") });
    if destination.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "destination is null");
    }
    // SAFETY: writable for `size` bytes, per the contract.
    let destination = unsafe { std::slice::from_raw_parts_mut(destination.cast::<u8>(), size) };
    guarded(|| match handle.map.load_data_into(key, destination) {
        Ok(()) => XnnblobStatus::Ok,
        Err(e) => map_status(e),
    })
}

/// The layout stored with `key`: `*has_layout` is 1 and `*out` filled, or 0 when the blob was
/// stored without one.
///
/// # Safety
/// `map` is null or a live handle; `key` is null or NUL-terminated; `out` and `has_layout` are
/// null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_layout(
    map: *const XnnblobMap,
    key: *const c_char,
    out: *mut XnnblobLayout,
    has_layout: *mut i32,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(map, "map") });
    // SAFETY: forwarded contract.
    let key = try_arg!(unsafe { text_arg(key, "key") });
    if out.is_null() || has_layout.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out or has_layout is null");
    }
    guarded(|| match handle.map.get_tensor_layout(key) {
        Ok(None) => {
            // SAFETY: non-null and writable, per the contract.
            unsafe { *has_layout = 0 };
            XnnblobStatus::Ok
        }
        Ok(Some(layout)) if layout.sizes().len() > 16 => fail(
            XnnblobStatus::InvalidFormat,
            format!(
                "{key}: {} dimensions, C layouts hold 16",
                layout.sizes().len()
            ),
        ),
        Ok(Some(layout)) => {
            let mut c = XnnblobLayout {
                scalar_type: layout.scalar_type().code(),
                num_dims: layout.sizes().len() as u32,
                sizes: [0; 16],
                dim_order: [0; 16],
            };
            c.sizes[..layout.sizes().len()].copy_from_slice(layout.sizes());
            c.dim_order[..layout.dim_order().len()].copy_from_slice(layout.dim_order());
            // SAFETY: non-null and writable, per the contract.
            unsafe {
                *out = c;
                *has_layout = 1;
            }
            XnnblobStatus::Ok
        }
        Err(e) => map_status(e),
    })
}

/// Closes a map (null is allowed); buffers still held keep their bytes mapped.
///
/// # Safety
/// `map` is null or a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_map_close(map: *mut XnnblobMap) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(map) }
}

/// A backend handle for C: one per process or per app, owning its caches.
pub struct XnnblobBackend {
    backend: Backend,
}

/// Makes a backend whose models split operators across `threads` threads (0 or 1: the calling
/// thread); initialises XNNPACK once per process.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_backend_new(
    threads: u32,
    out: *mut *mut XnnblobBackend,
) -> XnnblobStatus {
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| {
        let options = BackendOptions {
            threads: threads as usize,
            ..BackendOptions::default()
        };
        match Backend::new(options) {
            Ok(backend) => {
                let handle = Box::into_raw(Box::new(XnnblobBackend { backend }));
                // SAFETY: non-null and writable, per the contract.
                unsafe { *out = handle };
                XnnblobStatus::Ok
            }
            Err(BackendError::Cache(e)) => cache_status(e),
            Err(e) => fail(XnnblobStatus::Xnnpack, xnnblob::report::report(&e)),
        }
    })
}

/// The backend's packed-weight cache: its file cache at `path`, held open as long as the
/// backend lives and shared by everything loaded through it, or with `path` NULL its in-memory
/// cache. `*out` receives a cache handle, to [`xnnblob_cache_close`].
///
/// # Safety
/// `backend` is null or a live handle; `path` is null or NUL-terminated; `out` is null or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_backend_cache(
    backend: *const XnnblobBackend,
    path: *const c_char,
    out: *mut *mut XnnblobCache,
) -> XnnblobStatus {
    // SAFETY: null or a live handle, per the contract.
    let handle = try_arg!(unsafe { live(backend, "backend") });
    if path.is_null() {
        return open(out, || Ok(handle.backend.in_memory_cache().clone()));
    }
    // SAFETY: forwarded contract.
    let path = try_arg!(unsafe { text_arg(path, "path") });
    open(out, || {
        handle
            .backend
            .file_cache(std::path::Path::new(path))
            .map_err(cache_status)
    })
}

/// Frees a backend (null is allowed); caches and runtimes made through it may outlive it.
///
/// # Safety
/// `backend` is null or a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_backend_free(backend: *mut XnnblobBackend) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(backend) }
}

/// A thread pool handle for C: xnnblob's own pool, for runtimes a caller creates itself.
pub struct XnnblobThreadpool {
    pool: xnnblob::xnn::Threadpool,
}

/// Makes a pool of `threads` threads, the caller's counted as one (0 is taken as 1). XNNPACK
/// linked from xnnblob's static library serves its thread-pool calls with xnnblob's pools, which
/// never wait for a worker that is not running; pthreadpool's own `pthreadpool_create` is not
/// in the library. Pass [`xnnblob_threadpool_pthreadpool`] to `xnn_create_runtime_v4`.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_threadpool_new(
    threads: u32,
    out: *mut *mut XnnblobThreadpool,
) -> XnnblobStatus {
    if out.is_null() {
        return fail(XnnblobStatus::InvalidArgument, "out is null");
    }
    guarded(|| match xnnblob::xnn::Threadpool::new(threads as usize) {
        Ok(pool) => {
            let handle = Box::into_raw(Box::new(XnnblobThreadpool { pool }));
            // SAFETY: non-null and writable, per the contract.
            unsafe { *out = handle };
            XnnblobStatus::Ok
        }
        Err(e) => fail(XnnblobStatus::Xnnpack, xnnblob::report::report(&e)),
    })
}

/// The pool as XNNPACK's `pthreadpool_t` (NULL for a NULL pool); valid until
/// [`xnnblob_threadpool_free`], which must come after every runtime created with it is deleted.
///
/// # Safety
/// `pool` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_threadpool_pthreadpool(
    pool: *const XnnblobThreadpool,
) -> *mut c_void {
    // SAFETY: null or a live handle, per the contract.
    match unsafe { pool.as_ref() } {
        Some(p) => p.pool.as_pthreadpool(),
        None => std::ptr::null_mut(),
    }
}

/// Stops and frees a pool (NULL is allowed).
///
/// # Safety
/// `pool` is null or a live handle, not used again, and no runtime created with it is left.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_threadpool_free(pool: *mut XnnblobThreadpool) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(pool) }
}
