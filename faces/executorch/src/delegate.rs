//! One ExecuTorch delegate call site (`init`, `execute`) on xnnblob's process-wide backend.

use crate::ffi::{EtBuffer, EtCall, EtDataMap, EtError, InitOptions, Outcome, Status, TensorArg};
use crate::map::{EtBytes, EtMap, MapKeys};
use cxx::UniquePtr;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use xnnblob::backend::{
    Backend, BackendOptions, CacheNotice, WeightsCacheChoice, WorkspaceSharing,
};
use xnnblob::delegate::{DelegateError, Weights, XnnDelegate};
use xnnblob::named_data::DataBuffer;
use xnnblob::report::{panic_message, report};
use xnnblob::tensor::XNN_EXTRA_BYTES;
use xnnblob::tensor::{DType, Shape};
use xnnblob::xnn::{PoolOps, RawInput, RawOutput, Threadpool, XnnError};

/// The delegate of one `init` (empty when init failed: ExecuTorch never runs it then).
pub struct EtDelegate {
    inner: Option<XnnDelegate>,
    /// The call's argument each input, then each output, is bound to: its external id, as
    /// ExecuTorch's backend binds them (`args[id]`). A delegate whose method ignores an input
    /// has no value for it, so its ids skip that argument.
    arguments: Vec<usize>,
    /// How many arguments a call must pass: one past the largest of `arguments`.
    arguments_needed: usize,
    /// Its map's key list, kept while the delegate lives so that the next delegate made from
    /// the same map finds it.
    _keys: Option<Arc<MapKeys>>,
    /// Its payload, where it is small enough to be only its graph and the launch is warm (see
    /// [`KEPT_PAYLOAD_UP_TO`]): released with the delegate rather than at the end of its init.
    _payload: Option<DataBuffer>,
}

/// The largest payload a delegate of a warm launch keeps until it is destroyed, rather than
/// releasing it at the end of its init as ExecuTorch's backend does: under the mmap loader,
/// each release is an `munmap` of the payload's pages, which, while ExecuTorch's pool spins
/// its workers after starting them, interrupts their core to flush its TLB. A warm ViT's 16
/// delegates loaded in 1.207 ms keeping theirs against 1.321 ms releasing them (25 alternating
/// launches), the 124 delegates of a prefill-and-decode export initialised in 6.25 ms against
/// 7.62 ms (10; 2 cores). A payload this small holds its graph, not constant data (named
/// constants lie in the program's or a `.ptd`'s named data): what it keeps is a few pages of
/// the program file (the bytes the init read; 0.8 MiB for those 124), or that much heap under
/// the file loader. Larger payloads, whose inline constants are only read to be packed, and
/// those of a launch that packs, are released as before.
const KEPT_PAYLOAD_UP_TO: usize = 64 << 10;

impl EtDelegate {
    pub(crate) fn is_empty(&self) -> bool {
        self.inner.is_none()
    }
}

static BACKEND: OnceLock<Result<Backend, String>> = OnceLock::new();

/// Where the delegate inits of this process spent their time, summed over them: for runners,
/// and for the peer bench's floor (what ExecuTorch's method load, its thread pool and XNNPACK's
/// runtime creation take, which no backend avoids).
#[derive(Default)]
struct InitSpent {
    delegates: u64,
    /// Delegates that keep their payload until they are destroyed ([`KEPT_PAYLOAD_UP_TO`]).
    payloads_kept: u64,
    /// Each init, whole.
    total: std::time::Duration,
    /// Opening the caches its options name.
    weights: std::time::Duration,
    /// Asking whether ExecuTorch's thread pool is in use, and starting it (the first question of
    /// its size in a process starts its threads).
    pool: std::time::Duration,
    /// The delegate's own timings, summed.
    load: std::time::Duration,
    prepack: std::time::Duration,
    create: std::time::Duration,
    runtime: std::time::Duration,
    finalize: std::time::Duration,
}

static INIT_SPENT: Mutex<InitSpent> = Mutex::new(InitSpent {
    delegates: 0,
    payloads_kept: 0,
    total: std::time::Duration::ZERO,
    weights: std::time::Duration::ZERO,
    pool: std::time::Duration::ZERO,
    load: std::time::Duration::ZERO,
    prepack: std::time::Duration::ZERO,
    create: std::time::Duration::ZERO,
    runtime: std::time::Duration::ZERO,
    finalize: std::time::Duration::ZERO,
});

unsafe extern "C" {
    /// ExecuTorch's thread pool as pool operations (src/et_pool.cc).
    fn xnnblob_et_pool_ops() -> *const PoolOps;
    /// False under a `NoThreadPoolGuard`, or in a runtime without ExecuTorch's pool.
    fn xnnblob_et_pool_in_use() -> bool;
    /// Operator calls run on ExecuTorch's pool, and on the caller for want of one, so far.
    fn xnnblob_et_pool_runs(on_pool: *mut u64, on_caller: *mut u64);
    /// Looks up the functions of ExecuTorch's thread pool, without starting it.
    fn xnnblob_et_pool_look_up();
}

/// ExecuTorch's own thread pool, as the pool every runtime of the backend runs on.
fn executorch_threadpool() -> Threadpool {
    // SAFETY: the ops are a static table of src/et_pool.cc, valid for the process's life; they
    // ignore their pool argument (each call asks ExecuTorch for its current pool) and are
    // thread-safe as ExecuTorch's pthreadpool is.
    unsafe { Threadpool::with_ops(&*xnnblob_et_pool_ops(), std::ptr::null_mut()) }
}

/// The backend every program of the process shares: one shared data cache, one in-memory
/// packed-weight cache, at most one cache per file, and ExecuTorch's own thread pool (the one
/// its XNNPACK backend runs on, at the size the app gave it).
fn process_backend() -> Result<&'static Backend, Outcome> {
    BACKEND
        .get_or_init(|| {
            let backend = Backend::new(BackendOptions {
                threadpool: Some(Arc::new(executorch_threadpool())),
                // Damaged packed bytes are found after the launch, at low priority, and left
                // out of the file, so no launch after it serves them.
                cache_options: xnnblob::cache::CacheOptions {
                    verify: xnnblob::cache::VerifyPacked::Background,
                    ..Default::default()
                },
                ..Default::default()
            })
            .map_err(|e| report(&e));
            if backend.is_ok() {
                // Saves run in the background, off the load: nothing of a process-wide backend
                // is dropped at exit, so exit waits for them here.
                // SAFETY: registers a function that takes no arguments and does not unwind.
                unsafe { libc::atexit(wait_for_saves) };
            }
            backend
        })
        .as_ref()
        .map_err(|e| Outcome::error(Status::Internal, format!("xnnblob backend: {e}")))
}

/// Waits for every background save of the process's caches to be durable (at exit; a save that
/// fails costs only a repack at the next launch).
extern "C" fn wait_for_saves() {
    let _ = catch_unwind(|| {
        if let Some(Ok(backend)) = BACKEND.get() {
            for cache in backend.packed_caches() {
                // Said once, at exit: the packed weights were used from memory; the next launch
                // packs again. (ExecuTorch's logger may be gone by now: stderr.)
                if let Err(e) = cache.wait_saved() {
                    eprintln!("xnnblob: {}; not saved", report(&e));
                }
                if let Some(note) = cache.damage_note() {
                    eprintln!("xnnblob: packed-weight cache: {note}");
                }
            }
        }
    });
}

/// Makes the process-wide backend on a background thread; a load that comes first waits for it
/// (`process_backend` is a `OnceLock`), so nothing is made twice. The thread then stays, blocked,
/// to run the packed-weight caches' background saves and checks: a launch that packs hands its
/// save to it rather than starting a thread in its init.
pub(crate) fn prepare_backend() {
    // What ExecuTorch's backend does when it is loaded, on this thread: an app that loads its
    // first program at once (a runner, a test) would otherwise wait for it in that load.
    let _ = catch_unwind(xnnblob::backend::prepare_process);
    let spawned = std::thread::Builder::new()
        .name("xnnblob-prepare".into())
        .spawn(|| {
            xnnblob::mmap::map_in_own_data();
            let _ = catch_unwind(process_backend);
            // SAFETY: no arguments; the look-up is a function-local static, made once.
            unsafe { xnnblob_et_pool_look_up() };
            xnnblob::cache::serve_background_work()
        });
    // Without a thread, the first load makes the backend itself.
    drop(spawned);
}

/// What was said already, by path and topic (once per path in the process, not once per load).
fn reported() -> &'static Mutex<HashSet<(PathBuf, &'static str)>> {
    static REPORTED: OnceLock<Mutex<HashSet<(PathBuf, &'static str)>>> = OnceLock::new();
    REPORTED.get_or_init(Default::default)
}

/// Something a load says once, beside its success.
pub(crate) struct Note {
    text: String,
    /// ExecuTorch's Error level, not Info: the user's request was not met (the cache path
    /// cannot be used), or the user must act (the cache file is more readable than its model).
    severe: bool,
}

/// The packed-weight cache a load's options ask for.
fn weights_request(options: &InitOptions) -> Result<WeightsCacheChoice, Outcome> {
    let layers: Vec<PathBuf> = options
        .packed_cache_layers
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    Ok(match (
        options.weight_cache_enabled,
        options.packed_cache_path.as_str(),
    ) {
        (false, _) => WeightsCacheChoice::Disabled,
        (true, "") if !layers.is_empty() => {
            return Err(Outcome {
                status: Status::InvalidArgument,
                message: "packed_cache_layers needs packed_cache_path: the writable cache file                           that what the layers do not hold is packed into"
                    .into(),
                severe: true,
            })
        }
        (true, "") => WeightsCacheChoice::InMemory,
        (true, path) if layers.is_empty() => WeightsCacheChoice::File(PathBuf::from(path)),
        (true, path) => WeightsCacheChoice::Layered {
            layers,
            path: PathBuf::from(path),
        },
    })
}

/// The packed-weight cache of a load (the backend's one resolver), and what it has to say, once
/// per path in this process. A delegate that packs no weight (`payload`'s graph has no fully
/// connected layer, convolution or batch matrix multiply) asks no cache for anything: until the
/// process has opened the file its options name, such a delegate gets none, so a program of
/// elementwise operations opens (and makes) no cache file, and the file is opened by the first
/// delegate that packs. Once it is open, handing it over costs nothing.
fn weights_for(
    backend: &Backend,
    options: &InitOptions,
    payload: &[u8],
) -> Result<(Weights, Option<Note>), Outcome> {
    let request = weights_request(options)?;
    let file = matches!(
        request,
        WeightsCacheChoice::File(_) | WeightsCacheChoice::Layered { .. }
    );
    // A payload that does not parse is the init's to refuse, with its own error.
    if file
        && !backend.has_resolved(&request)
        && xnnblob::delegate::packs_weights(payload).is_ok_and(|packs| !packs)
    {
        return Ok((Weights::None, None));
    }
    let (weights, notice) = backend.resolve_weights(&request, options.verify_on_load);
    let mut notes = Vec::new();
    if let Some(notice) = notice {
        let path = match &notice {
            CacheNotice::ReadOnly { path }
            | CacheNotice::Rebuilt { path, .. }
            | CacheNotice::Unusable { path, .. } => path.clone(),
        };
        if reported().lock().insert((path, "cache")) {
            notes.push(Note {
                // The user's request was not met only when the path could not be used at all.
                severe: matches!(notice, CacheNotice::Unusable { .. }),
                text: notice.to_string(),
            });
        }
    }
    if let Weights::Packed(cache) = &weights {
        // ExecuTorch does not tell a backend which files a program came from: its packed
        // weights are kept as private as ExecuTorch's own cache keeps them.
        cache.limit_permissions(xnnblob::cache::PRIVATE_MODE);
        if let (Some(text), Some(path)) = (cache.permissions_note(), cache.path())
            && reported()
                .lock()
                .insert((path.to_path_buf(), "permissions"))
        {
            notes.push(Note { text, severe: true });
        }
    }
    // The backend passes one message to ExecuTorch's log per init.
    let note = notes.into_iter().reduce(|a, b| Note {
        text: format!("{}; {}", a.text, b.text),
        severe: a.severe || b.severe,
    });
    Ok((weights, note))
}

fn status_of(error: &DelegateError) -> Status {
    match error {
        DelegateError::PayloadTruncated { .. }
        | DelegateError::PayloadMagic { .. }
        | DelegateError::PayloadHeader(_)
        | DelegateError::PayloadIdentifier { .. }
        | DelegateError::PayloadVerifier(_)
        | DelegateError::BadGraph(_) => Status::InvalidProgram,
        DelegateError::OutOfMemory { .. } => Status::MemoryAllocationFailed,
        DelegateError::UnsupportedNode { .. } | DelegateError::UnsupportedDatatype { .. } => {
            Status::NotSupported
        }
        DelegateError::MissingConstant { .. } | DelegateError::UnreadConstant { .. } => {
            Status::InvalidExternalData
        }
        DelegateError::Xnn { error, .. } => match error {
            XnnError::OutOfMemory { .. } => Status::MemoryAllocationFailed,
            XnnError::Arity { .. }
            | XnnError::DtypeMismatch { .. }
            | XnnError::ShapeOutOfBounds { .. }
            | XnnError::ReshapedInputSize { .. }
            | XnnError::BufferTooSmall { .. } => Status::InvalidArgument,
            _ => Status::Internal,
        },
        _ => Status::Internal,
    }
}

/// What a successful init made: the delegate, its map's key list, a note to give ExecuTorch,
/// and the payload it keeps ([`KEPT_PAYLOAD_UP_TO`]).
struct Initialised {
    delegate: XnnDelegate,
    keys: Arc<MapKeys>,
    warning: Option<Note>,
    payload: Option<DataBuffer>,
}

fn init(
    options: &InitOptions,
    processed: UniquePtr<EtBuffer>,
    map: UniquePtr<EtDataMap>,
) -> Result<Initialised, Outcome> {
    let backend = process_backend()?;
    let processed = Arc::new(EtBytes(processed));
    let len = xnnblob::named_data::Backing::bytes(&*processed).len();
    let payload = DataBuffer::new(processed, 0, len).expect("the whole buffer");
    let opening = std::time::Instant::now();
    let (weights, warning) = weights_for(backend, options, payload.data())?;
    let opened = opening.elapsed();
    let sharing =
        WorkspaceSharing::from_code(options.workspace_sharing_mode.into()).ok_or_else(|| {
            Outcome::error(
                Status::InvalidArgument,
                format!(
                    "workspace_sharing_mode {} is not 0, 1 or 2",
                    options.workspace_sharing_mode
                ),
            )
        })?;
    let mut model = backend
        .model_with_workspace(weights, sharing)
        .map_err(|e| Outcome::error(Status::Internal, report(&e)))?;
    let asking = std::time::Instant::now();
    // SAFETY: a plain query of ExecuTorch's thread-pool state, no arguments.
    if !unsafe { xnnblob_et_pool_in_use() } {
        // As ExecuTorch's backend: a runtime created under a NoThreadPoolGuard has no pool.
        model = model.without_threadpool();
    }
    let asked = asking.elapsed();
    let map = Arc::new(
        EtMap::new(map).map_err(|e| Outcome::error(Status::InvalidExternalData, report(&e)))?,
    );
    let small = (len <= KEPT_PAYLOAD_UP_TO).then(|| payload.clone());
    let delegate = XnnDelegate::init_deferred(&model, payload, map.clone());
    map.close();
    let delegate = delegate.map_err(|e| Outcome::error(status_of(&e), report(&e)))?;
    // Kept where the launch is warm so far (its cache has packed nothing in this process): a
    // cold launch's peak is its packing, and a payload kept through it would add to the peak.
    // A delegate that packs no weight was given no cache although the options asked for one
    // (`weights_for`): it packs nothing either.
    let warm = match model.weights() {
        Weights::Packed(cache) => cache.packed_count() == 0,
        Weights::None => options.weight_cache_enabled,
        _ => false,
    };
    let kept = small.filter(|_| warm);
    let timings = delegate.init_timings();
    let mut spent = INIT_SPENT.lock();
    spent.payloads_kept += u64::from(kept.is_some());
    spent.weights += opened;
    spent.pool += asked + timings.pool_start;
    spent.load += timings.load;
    spent.prepack += timings.prepack;
    spent.create += timings.create;
    spent.runtime += timings.runtime;
    spent.finalize += timings.finalize;
    drop(spent);
    Ok(Initialised {
        delegate,
        keys: map.keys(),
        warning,
        payload: kept,
    })
}

pub(crate) fn delegate_init(
    options: &InitOptions,
    processed: UniquePtr<EtBuffer>,
    map: UniquePtr<EtDataMap>,
    outcome: &mut Outcome,
) -> Box<EtDelegate> {
    *outcome = Outcome::ok();
    let started = std::time::Instant::now();
    let initialised = guarded(|| init(options, processed, map));
    {
        let mut spent = INIT_SPENT.lock();
        spent.delegates += 1;
        spent.total += started.elapsed();
    }
    let (inner, keys, kept) = match initialised {
        Ok(Initialised {
            delegate,
            keys,
            warning,
            payload,
        }) => {
            if let Some(note) = warning {
                outcome.message = note.text;
                outcome.severe = note.severe;
            }
            (Some(delegate), Some(keys), payload)
        }
        Err(error) => {
            *outcome = error;
            (None, None, None)
        }
    };
    let arguments = inner.as_ref().map_or_else(Vec::new, |d| {
        d.inputs()
            .chain(d.outputs())
            .map(|e| e.id as usize)
            .collect()
    });
    let arguments_needed = arguments.iter().max().map_or(0, |&last| last + 1);
    Box::new(EtDelegate {
        inner,
        arguments,
        arguments_needed,
        _keys: keys,
        _payload: kept,
    })
}

fn describe(call: &EtCall, index: usize) -> Result<TensorArg, Outcome> {
    let mut arg = TensorArg {
        data: std::ptr::null_mut(),
        nbytes: 0,
        scalar_type: -1,
        rank: 0,
        sizes: [0; 16],
    };
    if !call.tensor(index, &mut arg) {
        return Err(Outcome::error(
            Status::NotSupported,
            format!("argument {index} is not a tensor of at most 16 dimensions in a dim order"),
        ));
    }
    Ok(arg)
}

fn dtype_of(arg: &TensorArg, index: usize) -> Result<DType, Outcome> {
    DType::from_scalar_type(arg.scalar_type).ok_or_else(|| {
        Outcome::error(
            Status::NotSupported,
            format!(
                "argument {index}: ExecuTorch scalar type {} is not bound by this backend",
                arg.scalar_type
            ),
        )
    })
}

fn shape_of(arg: &TensorArg, index: usize) -> Result<Shape, Outcome> {
    let sizes = arg.sizes.get(..arg.rank).unwrap_or(&[]);
    let dims: Vec<usize> = sizes.iter().map(|&d| d.max(0) as usize).collect();
    Shape::new(&dims).map_err(|_| {
        Outcome::error(
            Status::NotSupported,
            format!("argument {index}: rank {} is too high", arg.rank),
        )
    })
}

fn execute(delegate: &mut EtDelegate, mut call: Pin<&mut EtCall>) -> Result<(), Outcome> {
    let Some(d) = delegate.inner.as_mut() else {
        return Err(Outcome::error(
            Status::InvalidArgument,
            "this delegate failed to initialise",
        ));
    };
    let (n_in, n_out) = (d.inputs().len(), d.outputs().len());
    let (arguments, needed) = (&delegate.arguments, delegate.arguments_needed);
    if call.num_args() < needed {
        return Err(Outcome::error(
            Status::InvalidArgument,
            format!(
                "{} arguments given, the delegate's {n_in} inputs and {n_out} outputs are \
                 bound to arguments up to {}",
                call.num_args(),
                needed - 1
            ),
        ));
    }
    let mut inputs = Vec::with_capacity(n_in);
    for &index in &arguments[..n_in] {
        let arg = describe(&call, index)?;
        inputs.push((
            arg.data,
            arg.nbytes,
            dtype_of(&arg, index)?,
            shape_of(&arg, index)?,
        ));
    }
    // Set by the output callback, which cannot return an error through XNNPACK's binding.
    let mut failure: Option<Outcome> = None;
    // SAFETY: each input's data is readable for nbytes (ExecuTorch's tensor), and for
    // XNN_EXTRA_BYTES more where it is marked padded (they lie in the same page, which is
    // readable as a whole); each output writable for nbytes after its resize, for the duration
    // of this call; ExecuTorch's memory planning never aliases a delegate's inputs with its
    // outputs.
    let result = unsafe {
        d.execute_raw_shaped(
            |i| {
                let (data, len, dtype, shape) = inputs[i];
                // Bound in place when XNNPACK's over-read stays in the input's last page, as
                // it does for all but page-aligned ends: a copy per execute (a decoder's
                // caches, every token) otherwise.
                let end = data as usize + len;
                RawInput {
                    data: data.cast_const(),
                    len,
                    dtype,
                    shape,
                    padded: xnnblob::aligned::readable_in_page_after(end) >= XNN_EXTRA_BYTES,
                }
            },
            |j, shape| {
                let index = arguments[n_in + j];
                let mut sizes = [0i64; 16];
                let rank = shape.rank().min(sizes.len());
                for (to, &from) in sizes.iter_mut().zip(shape.dims()) {
                    *to = from as i64;
                }
                let sizes = &sizes[..rank];
                let mut arg = match describe(&call, index) {
                    Ok(arg) => arg,
                    Err(e) => {
                        failure.get_or_insert(e);
                        return RawOutput {
                            data: std::ptr::null_mut(),
                            capacity: 0,
                            dtype: DType::F32,
                        };
                    }
                };
                let code = call.as_mut().resize(index, sizes, &mut arg);
                let resized = code == EtError::Ok;
                if !resized {
                    failure.get_or_insert(Outcome::error(
                        Status::InvalidArgument,
                        format!(
                            "output {j}: resize_tensor to {sizes:?} failed (ExecuTorch error {:#x})",
                            code.repr
                        ),
                    ));
                }
                let dtype = DType::from_scalar_type(arg.scalar_type).unwrap_or(DType::F32);
                RawOutput {
                    data: arg.data,
                    capacity: if resized { arg.nbytes } else { 0 },
                    dtype,
                }
            },
        )
    };
    if let Some(f) = failure {
        return Err(f);
    }
    result.map_err(|e| Outcome::error(status_of(&e), report(&e)))
}

pub(crate) fn delegate_execute(delegate: &mut EtDelegate, call: Pin<&mut EtCall>) -> Outcome {
    guarded(|| execute(delegate, call)).map_or_else(|e| e, |()| Outcome::ok())
}

/// Runs a call from ExecuTorch with panics caught: the face's one panic policy. A panic becomes
/// the call's `Internal` outcome with its message, which ExecuTorch logs and returns as its
/// error; unwinding into ExecuTorch's C++ would abort the app.
fn guarded<T>(call: impl FnOnce() -> Result<T, Outcome>) -> Result<T, Outcome> {
    catch_unwind(AssertUnwindSafe(call))
        .unwrap_or_else(|panic| Err(Outcome::error(Status::Internal, panic_message(&*panic))))
}

pub(crate) fn save_caches() -> Outcome {
    let run = || -> Result<(), Outcome> {
        for cache in process_backend()?.packed_caches() {
            if cache.path().is_some() {
                cache
                    .finalize()
                    .and_then(|()| cache.wait_saved())
                    .map_err(|e| Outcome::error(Status::Internal, report(&e)))?;
            }
        }
        Ok(())
    };
    guarded(run).map_or_else(|e| e, |()| Outcome::ok())
}

pub(crate) fn cache_report() -> String {
    let Ok(backend) = process_backend() else {
        return String::new();
    };
    let (mut on_pool, mut on_caller) = (0u64, 0u64);
    // SAFETY: two valid out-pointers.
    unsafe { xnnblob_et_pool_runs(&mut on_pool, &mut on_caller) };
    let threads = backend
        .options()
        .threadpool
        .as_ref()
        .map_or(1, |p| p.threads());
    let mut lines = vec![
        format!(
            "pool executorch: threads {threads} operator_runs {on_pool} inline_runs {on_caller}"
        ),
        format!(
            "named_data_copied_bytes={}",
            xnnblob::named_data::copied_bytes()
        ),
        // Constants read through ExecuTorch's data maps (one `get_data` each).
        format!("executorch_map_reads={}", crate::map::reads()),
        // Delegates whose fp16 values XNNPACK computes as fp32 here (no fp16 GEMMs on this CPU).
        format!(
            "fp16_as_fp32_delegates={}",
            xnnblob::delegate::fp16_as_fp32_delegates()
        ),
    ];
    let spent = INIT_SPENT.lock();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    lines.push(format!(
        "init_delegates={}\ninit_payloads_kept={}\ninit_ms={:.3}\ninit_weights_ms={:.3}\n\
         init_pool_ms={:.3}\ninit_load_ms={:.3}\ninit_prepack_ms={:.3}\ninit_create_ms={:.3}\n\
         init_xnnpack_runtime_ms={:.3}\ninit_finalize_ms={:.3}",
        spent.delegates,
        spent.payloads_kept,
        ms(spent.total),
        ms(spent.weights),
        ms(spent.pool),
        ms(spent.load),
        ms(spent.prepack),
        ms(spent.create),
        ms(spent.runtime),
        ms(spent.finalize)
    ));
    drop(spent);
    for cache in backend.packed_caches() {
        let s = cache.stats();
        lines.push(format!(
            "cache {}: hits {} misses {} packed {} entries {} deferred_fills {} heap_entries {} \
             kept_constants {} kept_served {}",
            cache
                .path()
                .map_or_else(|| "memory".to_string(), |p| p.display().to_string()),
            s.hits,
            s.misses,
            s.packed,
            s.entries,
            s.deferred_fills,
            s.heap_entries,
            s.kept_constants,
            s.kept_served
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_an_entry_point_is_its_internal_outcome_and_the_process_goes_on() {
        let panicked: Result<(), Outcome> = guarded(|| panic!("forced by the test"));
        let outcome = panicked.expect_err("a caught panic is an error");
        assert_eq!(outcome.status, Status::Internal);
        assert!(
            outcome.message.contains("forced by the test"),
            "{}",
            outcome.message
        );
        // The entry points hold the same guard: each one turns a panic into this outcome.
        assert_eq!(guarded(|| Ok::<_, Outcome>(7)).ok(), Some(7));
        assert_eq!(
            save_caches().status,
            Status::Ok,
            "a later call through the face still works"
        );
    }
}
