//! xnnblob as ExecuTorch's XNNPACK backend.
//!
//! `libxnnblob_executorch.so` (or `.a`) registers a `BackendInterface` under the id
//! `XnnpackBackend` with ExecuTorch 1.5.1's runtime when it is loaded (`src/backend.cc`), so an app
//! switches to xnnblob by linking it instead of ExecuTorch's own XNNPACK backend. The C++ side
//! speaks ExecuTorch (options, `EValue`s, error codes); this side does the work on one process-wide
//! [`xnnblob::backend::Backend`]:
//! - constants come from the method's named-data map through the backend-wide shared data cache,
//!   and filters XNNPACK only packs are not read at all when their packing is cached
//!   ([`xnnblob::deferred`]), whatever data loader the app chose;
//! - packed weights come from xnnblob's packed-weight cache: in memory, shared by every program of
//!   the process, or the file `packed_cache_path` names;
//! - `processed` is released after init unless its inline constants are in use.

mod delegate;
mod map;
pub mod runtime_version;

pub use delegate::EtDelegate;

#[cxx::bridge(namespace = "xnnblob::et")]
pub mod ffi {
    /// What went wrong, in terms the C++ side turns into ExecuTorch's `Error`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u8)]
    enum Status {
        Ok,
        /// The payload is not a valid XNNPACK graph.
        InvalidProgram,
        /// Named data is missing, of the wrong size, or could not be read.
        InvalidExternalData,
        /// A node, datatype or argument kind this backend does not run.
        NotSupported,
        /// Arguments that do not fit the delegate (arity, dtype, shape, size).
        InvalidArgument,
        MemoryAllocationFailed,
        Internal,
    }

    /// ExecuTorch's `Error` codes (runtime/core/error.h) as its calls return them across the
    /// bridge, by name. A code not named here crosses too, by its value.
    #[derive(Debug)]
    #[repr(u32)]
    enum EtError {
        Ok = 0x00,
        Internal = 0x01,
        InvalidState = 0x02,
        NotSupported = 0x10,
        InvalidArgument = 0x12,
        NotFound = 0x20,
        MemoryAllocationFailed = 0x21,
        AccessFailed = 0x22,
        InvalidProgram = 0x23,
        InvalidExternalData = 0x24,
        OutOfResources = 0x25,
    }

    /// The options of one init: ExecuTorch's, per load over process-wide.
    struct InitOptions {
        /// False: no packed-weight cache at all (every load packs privately).
        weight_cache_enabled: bool,
        /// Empty: the in-memory cache shared by every program of the process.
        packed_cache_path: String,
        /// Read-only packed-weight caches made ahead of time (`xnnblob prepack`), files or
        /// directories, separated by `:`, consulted before `packed_cache_path` (xnnblob's
        /// `packed_cache_layers`). Empty: none.
        packed_cache_layers: String,
        /// ExecuTorch's codes: 0 disabled, 1 per model, 2 global.
        workspace_sharing_mode: i32,
        /// Check every packed weight of the cache file before the first execute (xnnblob's
        /// `verify_on_load`): no launch uses a damaged one, at the cost of reading them all.
        verify_on_load: bool,
    }

    /// An error (or, with `Status::Ok`, a note) for the C++ side to return and log.
    struct Outcome {
        status: Status,
        message: String,
        /// A note with `Status::Ok` that ExecuTorch's log gets at Error level: something the
        /// user asked for is not done (a cache path that cannot be used).
        severe: bool,
    }

    /// One tensor argument of a delegate call, as ExecuTorch's runtime holds it.
    struct TensorArg {
        data: *mut u8,
        nbytes: usize,
        /// ExecuTorch's `ScalarType` code.
        scalar_type: i8,
        rank: usize,
        /// Its sizes in the order of its dim order, outermost in memory first: a channels-last
        /// tensor's as N, H, W, C. XNNPACK's graph declares such an external in that order (as
        /// ExecuTorch's own backend binds it).
        sizes: [i64; 16],
    }

    unsafe extern "C++" {
        include!("xnnblob-executorch/src/bridge.h");

        /// A `FreeableBuffer` moved out of ExecuTorch (the processed payload, or named data).
        type EtBuffer;
        fn data(self: &EtBuffer) -> *const u8;
        fn size(self: &EtBuffer) -> usize;

        /// Whether loading the library registered "XnnpackBackend" (false: another backend
        /// took the id first).
        fn registered() -> bool;

        /// One delegate call's arguments (`Span<EValue*>`).
        type EtCall;
        fn num_args(self: &EtCall) -> usize;
        /// Describes argument `index`; false when it is not a tensor of at most 16 dimensions
        /// with a dim order.
        fn tensor(self: &EtCall, index: usize, arg: &mut TensorArg) -> bool;
        /// `resize_tensor` of argument `index` to `sizes`, given in the order of its dim order
        /// (as `tensor` describes it), then describes it again.
        fn resize(
            self: Pin<&mut EtCall>,
            index: usize,
            sizes: &[i64],
            arg: &mut TensorArg,
        ) -> EtError;

        /// The method's `NamedDataMap`, borrowed for the duration of one init.
        type EtDataMap;
        /// The number of keys. Every call of the map that can fail in C++ (ExecuTorch's error,
        /// or an allocation) is declared fallible: its exception arrives as an `Err`.
        fn num_keys(self: &EtDataMap) -> Result<u32>;
        /// Key `index`, as the map holds it (for as long as the map lives).
        fn key_at(self: &EtDataMap, index: u32) -> Result<&str>;
        /// The address of ExecuTorch's own map, which lives as long as its program (the
        /// wrapper lives for one init).
        fn identity(self: &EtDataMap) -> usize;
        /// `get_data(key)`; null with `error` set to ExecuTorch's error when it fails (an
        /// exception, such as an allocation's, arrives as an `Err`).
        fn get_data(
            self: &EtDataMap,
            key: &str,
            error: &mut EtError,
        ) -> Result<UniquePtr<EtBuffer>>;
    }

    extern "Rust" {
        type EtDelegate;

        /// Creates the delegate of one `init`: `processed` is kept only while inline constants
        /// of it are in use; `map` may be null (the program has no named data).
        fn delegate_init(
            options: &InitOptions,
            processed: UniquePtr<EtBuffer>,
            map: UniquePtr<EtDataMap>,
            outcome: &mut Outcome,
        ) -> Box<EtDelegate>;

        /// True when `delegate_init` failed (the box holds nothing to run).
        fn is_empty(self: &EtDelegate) -> bool;

        /// Runs one delegate call: its arguments are the inputs then the outputs, by ascending
        /// external id. Each output is resized to the shape of this run before it is written.
        fn delegate_execute(delegate: &mut EtDelegate, call: Pin<&mut EtCall>) -> Outcome;

        /// Saves every file-backed packed-weight cache now, and waits (ExecuTorch's
        /// `save_weight_cache_on_disk`).
        fn save_caches() -> Outcome;

        /// What the packed-weight caches did in this process, one line (for runners and tests).
        fn cache_report() -> String;

        /// Checks the ExecuTorch runtime this library runs in (`library`: the path of the
        /// loaded `libexecutorch.so`, empty where it cannot be found) against the version it was
        /// built against: `NotSupported` with both versions named when they differ; a note when
        /// the version is found, cannot be found, or cannot be read.
        fn check_runtime(library: &str) -> Outcome;

        /// Starts making the process-wide backend (XNNPACK's initialisation, the thread pool)
        /// on a background thread, so the first load finds it ready.
        fn prepare_backend();
    }
}

impl ffi::Outcome {
    fn ok() -> ffi::Outcome {
        ffi::Outcome {
            status: ffi::Status::Ok,
            message: String::new(),
            severe: false,
        }
    }

    fn error(status: ffi::Status, message: impl Into<String>) -> ffi::Outcome {
        ffi::Outcome {
            status,
            message: message.into(),
            severe: true,
        }
    }
}

/// The drop-in's verdict on the runtime at `library` (see [`runtime_version`]).
fn check_runtime(library: &str) -> ffi::Outcome {
    use runtime_version::{BUILT_AGAINST, RuntimeError, check};
    if library.is_empty() {
        return ffi::Outcome {
            status: ffi::Status::Ok,
            message: format!(
                "the loaded libexecutorch.so cannot be found (linked statically?): its version \
                 is not checked against {BUILT_AGAINST}"
            ),
            severe: false,
        };
    }
    let note = |message: String, severe: bool| ffi::Outcome {
        status: ffi::Status::Ok,
        message,
        severe,
    };
    match check(std::path::Path::new(library)) {
        Ok(Some(found)) => note(
            format!(
                "ExecuTorch {} ({}), built against {BUILT_AGAINST}",
                found.version,
                found.file.display()
            ),
            false,
        ),
        Ok(None) => note(
            format!(
                "no version file beside {library} (not ExecuTorch's wheel?): its version is not \
                 checked against {BUILT_AGAINST}"
            ),
            false,
        ),
        Err(e @ RuntimeError::Unreadable { .. }) => {
            note(format!("{e}: not checked against {BUILT_AGAINST}"), true)
        }
        Err(e @ RuntimeError::Differs { .. }) => {
            ffi::Outcome::error(ffi::Status::NotSupported, e.to_string())
        }
    }
}

use delegate::{cache_report, delegate_execute, delegate_init, prepare_backend, save_caches};

/// Whether loading this library registered its backend under "XnnpackBackend" with ExecuTorch
/// (false: another XNNPACK backend was registered first). Exported for runners that `dlopen` it;
/// referencing the registration also keeps it in every library this crate is linked into.
#[unsafe(no_mangle)]
pub extern "C" fn xnnblob_executorch_registered() -> bool {
    ffi::registered()
}

/// Writes what xnnblob's packed-weight caches did in this process (one line per cache: hits,
/// misses, weights packed, entries, placeholders read in) into `buffer`, NUL terminated and
/// truncated to `size`; returns the full length.
///
/// # Safety
/// `buffer` is null (with `size` 0) or writable for `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xnnblob_executorch_cache_report(
    buffer: *mut std::ffi::c_char,
    size: usize,
) -> usize {
    let text = std::panic::catch_unwind(cache_report).unwrap_or_default();
    if !buffer.is_null() && size > 0 {
        let n = text.len().min(size - 1);
        // SAFETY: the caller makes `size` bytes writable at `buffer`; n + 1 <= size.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast(), buffer, n);
            *buffer.add(n) = 0;
        }
    }
    text.len()
}
