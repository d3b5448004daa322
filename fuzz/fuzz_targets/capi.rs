//! xnnblob's C ABI (`xnnblob_capi::capi`) with fuzzer-chosen bytes and lengths: a file of any bytes
//! opened as named data (`xnnblob_map_open`, every key, its bytes in place and copied, its
//! layout, a fuzzer-chosen key and destination size, an index past the keys) and as a
//! packed-weight cache (`xnnblob_cache_open_file`, or a backend's file cache with 0 or 1 threads;
//! registration of fuzzer bytes under a given or computed digest, stats, a save), plus null
//! arguments. Decoded by `xnnblob_fuzz::capi_input`. Pointers passed are always valid: the ABI's
//! contract makes the caller answer for those.
//!
//! Asserted: no call reports `Internal` (a panic inside xnnblob); every failure leaves a message
//! for `xnnblob_last_error`; a map's keys can all be read, their bytes in place equal their
//! copied bytes, a copy succeeds exactly when the key exists and the size is the blob's, and an
//! index past the keys is `NotFound`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::ffi::{CStr, CString, c_char};
use std::ptr;
use xnnblob::cache::format::{self, Compat};
use xnnblob::cache::{checksum64, cpu_fingerprint};
use xnnblob_capi::capi::*;
use xnnblob_fuzz::capi_input::{self as input, CapiInput};

/// Checks a status: never `Internal`, and a failure leaves a message.
fn status(s: XnnblobStatus, call: &str) -> XnnblobStatus {
    assert_ne!(s, XnnblobStatus::Internal, "{call}: {}", last_error());
    if s != XnnblobStatus::Ok {
        assert!(
            !last_error().is_empty(),
            "{call} failed ({s:?}) without a message"
        );
    }
    s
}

fn last_error() -> String {
    // SAFETY: xnnblob_last_error returns a NUL-terminated string valid until the next call on
    // this thread; it is copied at once.
    unsafe { CStr::from_ptr(xnnblob_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The bytes stamped with this build's XNNPACK identifier and CPU, with the header's and
/// index's checksums recomputed where the layout has them.
fn fixed_up(file: &[u8]) -> Vec<u8> {
    let mut d = file.to_vec();
    if d.len() < format::HEADER_SIZE + format::TRAILER_SIZE {
        return d;
    }
    let compat = Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: cpu_fingerprint(),
    };
    let header = format::encode_header(&compat);
    d[..format::HEADER_SIZE].copy_from_slice(&header);
    let trailer = d.len() - format::TRAILER_SIZE;
    if let Some(index) = format::index_offset(&d).and_then(|i| usize::try_from(i).ok())
        && (format::HEADER_SIZE..=trailer).contains(&index)
    {
        let sum = checksum64(&d[index..trailer]);
        d[trailer + 16..trailer + 24].copy_from_slice(&sum.to_le_bytes());
    }
    d
}

fn map_calls(path: &CStr, inp: &CapiInput<'_>) {
    let mut map: *mut XnnblobMap = ptr::null_mut();
    // SAFETY: `path` is NUL-terminated and `map` writable; both outlive the call.
    let opened = unsafe { xnnblob_map_open(path.as_ptr(), &mut map) };
    if status(opened, "xnnblob_map_open") != XnnblobStatus::Ok {
        return;
    }
    let mut n = 0usize;
    // SAFETY: `map` is the live handle just opened; `n` is writable.
    status(unsafe { xnnblob_map_num_keys(map, &mut n) }, "num_keys");
    let mut keys = Vec::with_capacity(n);
    for i in 0..n {
        let mut key: *const c_char = ptr::null();
        // SAFETY: live handle, writable out.
        let s = unsafe { xnnblob_map_key_at(map, i, &mut key) };
        assert_eq!(status(s, "key_at"), XnnblobStatus::Ok, "key {i} of {n}");
        // SAFETY: a key the map hands out is NUL-terminated and lives as long as the map.
        let key = unsafe { CStr::from_ptr(key) }.to_owned();
        check_key(map, &key, None);
        keys.push(key);
    }
    let mut key: *const c_char = ptr::null();
    let index = n + usize::from(inp.index);
    // SAFETY: live handle, writable out.
    let past = unsafe { xnnblob_map_key_at(map, index, &mut key) };
    assert_eq!(
        status(past, "key_at past the keys"),
        XnnblobStatus::NotFound
    );
    let chosen = CString::new(inp.key).expect("cut at its first NUL");
    let known = keys.contains(&chosen);
    let mut destination = vec![0u8; usize::from(inp.size)];
    // SAFETY: live handle, NUL-terminated key, destination writable for its length.
    let s = unsafe {
        xnnblob_map_load_into(
            map,
            chosen.as_ptr(),
            destination.as_mut_ptr().cast(),
            destination.len(),
        )
    };
    if status(s, "load_into a chosen key") == XnnblobStatus::Ok {
        assert!(known, "a copy of a key the map does not list");
    }
    if known {
        check_key(map, &chosen, Some((usize::from(inp.size), s)));
    }
    // SAFETY: live handle, closed once.
    unsafe { xnnblob_map_close(map) };
}

/// Reads `key` every way the ABI offers; `copied` is a copy already tried: its size and status.
fn check_key(map: *const XnnblobMap, key: &CStr, copied: Option<(usize, XnnblobStatus)>) {
    let mut buffer: *mut XnnblobBuffer = ptr::null_mut();
    // SAFETY: `map` is live; `key` NUL-terminated; `buffer` writable.
    let s = unsafe { xnnblob_map_get_data(map, key.as_ptr(), &mut buffer) };
    assert_eq!(
        status(s, "get_data of a listed key"),
        XnnblobStatus::Ok,
        "{key:?}"
    );
    // SAFETY: `buffer` is the live buffer handle just returned.
    let (data, size) = unsafe { (xnnblob_buffer_data(buffer), xnnblob_buffer_size(buffer)) };
    let in_place: Vec<u8> = if size == 0 {
        Vec::new()
    } else {
        // SAFETY: a live buffer's data is readable for its size while the buffer lives.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec()
    };
    // SAFETY: released once, not used after.
    unsafe { xnnblob_buffer_release(buffer) };
    if let Some((tried, s)) = copied {
        assert_eq!(
            s == XnnblobStatus::Ok,
            tried == size,
            "copy of {tried} into {size}"
        );
    }
    let mut copy = vec![0u8; size];
    // SAFETY: live map, NUL-terminated key, `copy` writable for its length.
    let s = unsafe { xnnblob_map_load_into(map, key.as_ptr(), copy.as_mut_ptr().cast(), size) };
    assert_eq!(status(s, "load_into the blob's size"), XnnblobStatus::Ok);
    assert!(
        copy == in_place,
        "{key:?}: copied bytes differ from those in place"
    );
    let mut layout = XnnblobLayout {
        scalar_type: 0,
        num_dims: 0,
        sizes: [0; 16],
        dim_order: [0; 16],
    };
    let mut has = -1;
    // SAFETY: live map, NUL-terminated key, both outs writable.
    let s = unsafe { xnnblob_map_layout(map, key.as_ptr(), &mut layout, &mut has) };
    if status(s, "layout") == XnnblobStatus::Ok {
        assert!(has == 0 || (has == 1 && layout.num_dims <= 16), "has {has}");
    }
}

fn cache_calls(path: &CStr, inp: &CapiInput<'_>) {
    let mut backend: *mut XnnblobBackend = ptr::null_mut();
    let mut cache: *mut XnnblobCache = ptr::null_mut();
    let opened = if inp.flags & input::VIA_BACKEND != 0 {
        // SAFETY: `backend` is writable.
        let s = unsafe { xnnblob_backend_new(inp.threads(), &mut backend) };
        assert_eq!(status(s, "backend_new"), XnnblobStatus::Ok);
        // SAFETY: live backend, NUL-terminated path, writable out.
        unsafe { xnnblob_backend_cache(backend, path.as_ptr(), &mut cache) }
    } else {
        // SAFETY: NUL-terminated path, writable out.
        unsafe { xnnblob_cache_open_file(path.as_ptr(), &mut cache) }
    };
    if status(opened, "open a cache file") == XnnblobStatus::Ok {
        // SAFETY: `cache` is the live handle just opened.
        assert!(!unsafe { xnnblob_cache_xnn(cache) }.is_null());
        // A blob's bytes: the file's first bytes (never empty: the ABI refuses null data).
        let blob: &[u8] = match inp.file.get(..usize::from(inp.register)) {
            Some(b) if !b.is_empty() => b,
            _ => b"x",
        };
        let digest = if inp.flags & input::GIVEN_DIGEST != 0 {
            inp.digest.as_ptr()
        } else {
            ptr::null()
        };
        // SAFETY: live cache; `blob` is readable for its length and outlives the registration
        // (unregistered below); `digest` is null or 32 readable bytes.
        let s = unsafe { xnnblob_cache_register(cache, blob.as_ptr().cast(), blob.len(), digest) };
        assert_eq!(status(s, "register"), XnnblobStatus::Ok);
        let mut stats = XnnblobCacheStats::default();
        // SAFETY: live cache, writable out.
        let s = unsafe { xnnblob_cache_get_stats(cache, &mut stats) };
        assert_eq!(status(s, "get_stats"), XnnblobStatus::Ok);
        assert_eq!(
            stats.hits + stats.misses + stats.packed,
            0,
            "nothing looked up yet"
        );
        // SAFETY: live cache; `blob` is the registered pointer.
        let s = unsafe { xnnblob_cache_unregister(cache, blob.as_ptr().cast()) };
        assert_eq!(status(s, "unregister"), XnnblobStatus::Ok);
        if inp.flags & input::FINALIZE != 0 {
            // SAFETY: live cache.
            status(unsafe { xnnblob_cache_finalize(cache) }, "finalize");
            // SAFETY: live cache.
            status(unsafe { xnnblob_cache_wait_saved(cache) }, "wait_saved");
        }
    }
    // SAFETY: null or live handles, each closed once; the cache first, which may outlive the
    // backend anyway.
    unsafe {
        xnnblob_cache_close(cache);
        xnnblob_backend_free(backend);
    }
}

/// Null arguments are errors, not crashes.
fn null_calls() {
    let mut n = 0usize;
    // SAFETY: null handles are part of the contract; `n` is writable.
    let s = unsafe { xnnblob_map_num_keys(ptr::null(), &mut n) };
    assert_eq!(status(s, "num_keys(null)"), XnnblobStatus::InvalidArgument);
    let mut map: *mut XnnblobMap = ptr::null_mut();
    // SAFETY: a null path is part of the contract; `map` is writable.
    let s = unsafe { xnnblob_map_open(ptr::null(), &mut map) };
    assert_eq!(status(s, "map_open(null)"), XnnblobStatus::InvalidArgument);
    // SAFETY: a null cache is part of the contract.
    let s =
        unsafe { xnnblob_cache_register(ptr::null_mut(), b"x".as_ptr().cast(), 1, ptr::null()) };
    assert_eq!(status(s, "register(null)"), XnnblobStatus::InvalidArgument);
}

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    let inp = CapiInput::decode(data);
    null_calls();
    if inp.flags & input::MAP != 0 {
        let path = xnnblob_fuzz::scratch_file("input.ptd", inp.file);
        let path = CString::new(path.to_str().expect("a UTF-8 scratch path")).expect("no NUL");
        map_calls(&path, &inp);
    }
    if inp.flags & input::CACHE != 0 {
        let file = if inp.flags & input::FIX_HEADER != 0 {
            fixed_up(inp.file)
        } else {
            inp.file.to_vec()
        };
        let path = xnnblob_fuzz::scratch_file("input.xbc", &file);
        let path = CString::new(path.to_str().expect("a UTF-8 scratch path")).expect("no NUL");
        cache_calls(&path, &inp);
    }
});
