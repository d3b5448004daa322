//! The C ABI from C (examples/c_xnnpack and hooks/c_map_check.c, compiled as C99 against
//! faces/capi/include/xnnblob.h and XNNPACK's header): raw XNNPACK with xnnblob's cache. Each launch is a fresh process: the
//! first packs and saves, the second packs nothing and computes the same outputs.

use std::process::Command;

/// `xnnblob_cache_stats` as C lays it out.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct CacheStats {
    hits: u64,
    misses: u64,
    packed: u64,
    entries: u64,
    packed_bytes: u64,
}

unsafe extern "C" {
    fn xnnblob_c_cache_check_layered(
        path: *const std::ffi::c_char,
        layer: *const std::ffi::c_char,
        output: *mut f32,
        stats: *mut CacheStats,
    ) -> i32;
    fn xnnblob_c_identity_check(
        path: *const std::ffi::c_char,
        error: *mut f32,
        stats: *mut CacheStats,
    ) -> i32;
    fn xnnblob_last_error() -> *const std::ffi::c_char;
    fn xnnblob_checks_panic_inside_guard() -> i32;
    fn xnnblob_c_map_check(
        path: *const std::ffi::c_char,
        keys: *mut usize,
        bytes: *mut usize,
        with_layout: *mut usize,
    ) -> i32;
}

const CHILD: &str = "XNNBLOB_C_ABI_CHILD";
/// With [`CHILD`]: a read-only layer for the child's cache.
const CHILD_LAYER: &str = "XNNBLOB_C_ABI_CHILD_LAYER";

/// In a child process: runs the C program once and prints its outputs and counters.
#[test]
fn c_launch() {
    let Ok(path) = std::env::var(CHILD) else {
        return; // Only as a child of the test below.
    };
    let path = std::ffi::CString::new(path).unwrap();
    let layer = std::env::var(CHILD_LAYER)
        .ok()
        .map(|l| std::ffi::CString::new(l).unwrap());
    let mut output = [f32::NAN; 8];
    let mut stats = CacheStats::default();
    // SAFETY: a NUL-terminated path, a null or NUL-terminated layer, 8 writable floats, a
    // writable stats struct.
    let result = unsafe {
        xnnblob_c_cache_check_layered(
            path.as_ptr(),
            layer.as_ref().map_or(std::ptr::null(), |l| l.as_ptr()),
            output.as_mut_ptr(),
            &mut stats,
        )
    };
    // SAFETY: xnnblob_last_error returns a NUL-terminated string valid until the next call.
    let error = unsafe { std::ffi::CStr::from_ptr(xnnblob_last_error()) };
    assert_eq!(result, 0, "step {result}: {error:?}");
    let bits: Vec<String> = output.iter().map(|v| v.to_bits().to_string()).collect();
    println!(
        "RESULT packed={} hits={} entries={} outputs={}",
        stats.packed,
        stats.hits,
        stats.entries,
        bits.join(",")
    );
}

fn launch(path: &std::path::Path) -> (u64, u64, u64, String) {
    launch_layered(path, None)
}

fn launch_layered(
    path: &std::path::Path,
    layer: Option<&std::path::Path>,
) -> (u64, u64, u64, String) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    if let Some(layer) = layer {
        command.env(CHILD_LAYER, layer);
    }
    let out = command
        .args([
            "--exact",
            &crate::common::test_path(module_path!(), "c_launch"),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no result in {stdout}"));
    let field = |name: &str| -> String {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
            .to_string()
    };
    (
        field("packed").parse().unwrap(),
        field("hits").parse().unwrap(),
        field("entries").parse().unwrap(),
        field("outputs"),
    )
}

#[test]
fn a_c_program_packs_once_and_a_second_process_packs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights.xbc");
    let (packed, hits, entries, cold) = launch(&path);
    assert_eq!((packed, hits, entries), (2, 0, 2), "cold");
    assert!(path.is_file());
    let size = std::fs::metadata(&path).unwrap().len();
    let (packed, hits, entries, warm) = launch(&path);
    assert_eq!((packed, hits, entries), (0, 2, 2), "warm");
    assert_eq!(warm, cold, "identical outputs");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
}

/// Issue 40 through the C ABI (`xnnblob_cache_open_layered`): a cache file made by one process
/// serves another as a read-only layer under a new writable path; that process packs nothing,
/// gives the same outputs, and leaves the layer as it was and the writable path unmade.
#[test]
fn a_c_program_under_a_read_only_layer_packs_nothing_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let layer = dir.path().join("bundle.xbc");
    let (packed, _, _, cold) = launch(&layer);
    assert_eq!(packed, 2, "cold");
    let before = std::fs::read(&layer).unwrap();
    let writable = dir.path().join("writable.xbc");
    let (packed, hits, entries, first) = launch_layered(&writable, Some(&layer));
    assert_eq!((packed, hits, entries), (0, 2, 2), "under the layer");
    assert_eq!(first, cold, "identical outputs");
    assert_eq!(
        std::fs::read(&layer).unwrap(),
        before,
        "the layer is never written"
    );
    assert!(!writable.exists(), "nothing new: nothing saved");
}

const IDENTITY_CHILD: &str = "XNNBLOB_C_IDENTITY_CHILD";

/// In a child process: the C identity check (hooks/c_identity_check.c) once.
#[test]
fn c_identity_launch() {
    let Ok(path) = std::env::var(IDENTITY_CHILD) else {
        return; // Only as a child of the test below.
    };
    let path = std::ffi::CString::new(path).unwrap();
    let mut error = f32::NAN;
    let mut stats = CacheStats::default();
    // SAFETY: a NUL-terminated path, a writable float and stats struct.
    let result = unsafe { xnnblob_c_identity_check(path.as_ptr(), &mut error, &mut stats) };
    // SAFETY: xnnblob_last_error returns a NUL-terminated string valid until the next call.
    let message = unsafe { std::ffi::CStr::from_ptr(xnnblob_last_error()) };
    assert_eq!(result, 0, "step {result}: {message:?}");
    println!(
        "RESULT packed={} hits={} entries={} error={error}",
        stats.packed, stats.hits, stats.entries
    );
}

/// One buffer registered by its bytes through the C ABI and packed by raw XNNPACK as [64, 128]
/// and as [128, 64]: two packings, each layer right (within 1e-4 of plain C), cold and in a
/// second process warm (issue 38; the seeds were `out ^ in ^ ...` before patch 0006, one for
/// both shapes).
#[test]
fn through_the_c_abi_the_same_bytes_in_transposed_shapes_are_two_packings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("twins.xbc");
    let launch = || {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &crate::common::test_path(module_path!(), "c_identity_launch"),
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(IDENTITY_CHILD, &path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .find_map(|l| l.split_once("RESULT ").map(|(_, rest)| rest.to_string()))
            .unwrap_or_else(|| panic!("no result in {stdout}"))
    };
    let field = |line: &str, name: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    let cold = launch();
    assert_eq!(field(&cold, "packed"), 2.0, "two packings: {cold}");
    assert_eq!(field(&cold, "entries"), 2.0, "{cold}");
    assert!(field(&cold, "error") <= 1e-4, "{cold}");
    let warm = launch();
    assert_eq!(field(&warm, "packed"), 0.0, "warm packs nothing: {warm}");
    assert_eq!(field(&warm, "hits"), 2.0, "{warm}");
    assert!(field(&warm, "error") <= 1e-4, "{warm}");
}

#[test]
fn null_arguments_are_errors_with_a_message() {
    // SAFETY: the C ABI's contract allows null for each of these.
    unsafe {
        let status =
            xnnblob_capi::capi::xnnblob_cache_open_file(std::ptr::null(), std::ptr::null_mut());
        assert_eq!(status, xnnblob_capi::capi::XnnblobStatus::InvalidArgument);
        let message = std::ffi::CStr::from_ptr(xnnblob_last_error());
        assert_eq!(message.to_str().unwrap(), "path is null");
        let status = xnnblob_capi::capi::xnnblob_cache_finalize(std::ptr::null_mut());
        assert_eq!(status, xnnblob_capi::capi::XnnblobStatus::InvalidArgument);
        assert!(xnnblob_capi::capi::xnnblob_cache_xnn(std::ptr::null_mut()).is_null());
        let mut lost = 7usize;
        let status = xnnblob_capi::capi::xnnblob_cache_lost_maps(std::ptr::null(), &mut lost);
        assert_eq!(status, xnnblob_capi::capi::XnnblobStatus::InvalidArgument);
        assert_eq!(lost, 7, "nothing written on error");
        xnnblob_capi::capi::xnnblob_cache_close(std::ptr::null_mut());
    }
}

/// The C header declares exactly the functions the Rust side exports, with as many parameters.
#[test]
fn the_header_matches_the_rust_side() {
    let root = crate::common::repo_root();
    let header = std::fs::read_to_string(root.join("faces/capi/include/xnnblob.h")).unwrap();
    let rust = std::fs::read_to_string(root.join("faces/capi/src/capi.rs")).unwrap();
    // Parameters, ignoring a trailing comma (rustfmt writes one) and C's `(void)`.
    let arity = |params: &str| {
        params
            .split(',')
            .filter(|p| !p.trim().is_empty() && p.trim() != "void")
            .count()
    };
    // Comments hold examples with calls in them: drop them first.
    let mut header_code = String::new();
    let mut rest = header.as_str();
    while let Some(start) = rest.find("/*") {
        header_code.push_str(&rest[..start]);
        let end = rest[start..].find("*/").expect("closed comment");
        rest = &rest[start + end + 2..];
    }
    header_code.push_str(rest);
    // Declarations: `<type> name(params);` possibly over several lines.
    let flat = header_code.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut declared: Vec<(String, usize)> = flat
        .split(';')
        .filter_map(|decl| {
            let open = decl.find('(')?;
            let name = decl[..open].split([' ', '*']).next_back()?.to_string();
            let close = decl.rfind(')')?;
            name.starts_with("xnnblob_")
                .then(|| (name, arity(&decl[open + 1..close])))
        })
        .collect();
    let flat = rust.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut exported: Vec<(String, usize)> = flat
        .split("extern \"C\" fn ")
        .skip(1)
        .map(|rest| {
            let open = rest.find('(').unwrap();
            let close = rest.find(')').unwrap();
            (
                rest[..open].to_string(),
                arity(&rest[open + 1..close].replace(", )", ")")),
            )
        })
        // The test hook for the panic policy is not part of the ABI users get.
        .filter(|(name, _)| !name.starts_with("xnnblob_test_"))
        .collect();
    declared.sort();
    exported.sort();
    assert_eq!(declared, exported);
    assert_eq!(
        std::mem::size_of::<xnnblob_capi::capi::XnnblobCacheStats>(),
        40
    );
    assert_eq!(
        std::mem::size_of::<xnnblob_capi::capi::XnnblobLayout>(),
        4 + 4 + 64 + 16
    );
    for (name, value) in [
        ("XNNBLOB_OK", xnnblob_capi::capi::XnnblobStatus::Ok),
        (
            "XNNBLOB_INVALID_ARGUMENT",
            xnnblob_capi::capi::XnnblobStatus::InvalidArgument,
        ),
        ("XNNBLOB_IO", xnnblob_capi::capi::XnnblobStatus::Io),
        (
            "XNNBLOB_INVALID_FORMAT",
            xnnblob_capi::capi::XnnblobStatus::InvalidFormat,
        ),
        (
            "XNNBLOB_INTERNAL",
            xnnblob_capi::capi::XnnblobStatus::Internal,
        ),
        (
            "XNNBLOB_NOT_FOUND",
            xnnblob_capi::capi::XnnblobStatus::NotFound,
        ),
        (
            "XNNBLOB_XNNPACK",
            xnnblob_capi::capi::XnnblobStatus::Xnnpack,
        ),
    ] {
        assert!(
            header.contains(&format!("{name} = {}", value as i32)),
            "{name} = {}",
            value as i32
        );
    }
}

#[test]
fn a_c_program_reads_every_key_of_a_ptd_as_rust_does() {
    use xnnblob::named_data::{FileDataMap, NamedDataMap};
    let root = crate::common::dir();
    for name in ["mlp_portable_external.ptd", "mlp_qd8_qc8w_external.ptd"] {
        let path = root.join(name);
        let map = FileDataMap::open(&path).unwrap();
        let (mut keys, mut bytes, mut with_layout) = (0usize, 0usize, 0usize);
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path and three writable counters.
        let result = unsafe {
            xnnblob_c_map_check(c_path.as_ptr(), &mut keys, &mut bytes, &mut with_layout)
        };
        assert_eq!(result, 0, "{name}: step {result}");
        assert_eq!(keys, map.num_keys(), "{name}");
        let expected: usize = (0..map.num_keys())
            .map(|i| map.data_size(map.key_at(i).unwrap()).unwrap())
            .sum();
        assert_eq!(bytes, expected, "{name}");
        let layouts = (0..map.num_keys())
            .filter(|&i| {
                map.get_tensor_layout(map.key_at(i).unwrap())
                    .unwrap()
                    .is_some()
            })
            .count();
        assert_eq!(with_layout, layouts, "{name}");
    }
}

#[test]
fn a_backend_hands_out_its_caches() {
    use xnnblob_capi::capi::*;
    let dir = tempfile::tempdir().unwrap();
    let path = std::ffi::CString::new(dir.path().join("b.xbc").to_str().unwrap()).unwrap();
    // SAFETY: writable out-pointers, NUL-terminated paths, handles used once each.
    unsafe {
        let mut backend = std::ptr::null_mut();
        assert_eq!(xnnblob_backend_new(2, &mut backend), XnnblobStatus::Ok);
        let (mut a, mut b, mut memory) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(
            xnnblob_backend_cache(backend, path.as_ptr(), &mut a),
            XnnblobStatus::Ok
        );
        assert_eq!(
            xnnblob_backend_cache(backend, path.as_ptr(), &mut b),
            XnnblobStatus::Ok
        );
        assert_eq!(
            xnnblob_backend_cache(backend, std::ptr::null(), &mut memory),
            XnnblobStatus::Ok
        );
        // One file, one cache: both handles give XNNPACK the same provider.
        assert_eq!(xnnblob_cache_xnn(a), xnnblob_cache_xnn(b));
        assert_ne!(xnnblob_cache_xnn(a), xnnblob_cache_xnn(memory));
        let mut stats = XnnblobCacheStats::default();
        assert_eq!(xnnblob_cache_get_stats(a, &mut stats), XnnblobStatus::Ok);
        assert_eq!(stats.entries, 0);
        xnnblob_backend_free(backend);
        // The caches outlive the backend.
        assert_eq!(xnnblob_cache_finalize(a), XnnblobStatus::Ok);
        xnnblob_cache_close(a);
        xnnblob_cache_close(b);
        xnnblob_cache_close(memory);
        let mut none = std::ptr::null_mut();
        assert_eq!(
            xnnblob_backend_cache(std::ptr::null(), path.as_ptr(), &mut none),
            XnnblobStatus::InvalidArgument
        );
    }
}

#[test]
fn a_panic_inside_a_c_call_is_its_error_and_the_process_goes_on() {
    // SAFETY: takes no arguments; the guard every C entry point runs in catches the panic.
    let status = unsafe { xnnblob_checks_panic_inside_guard() };
    assert_ne!(status, 0, "a failure status");
    // SAFETY: a NUL-terminated string owned by this thread's last-error slot, read at once.
    let error = unsafe { std::ffi::CStr::from_ptr(xnnblob_last_error()) };
    let error = error.to_string_lossy();
    assert!(error.contains("forced by the check"), "{error}");
}
