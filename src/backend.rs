//! The backend: what every program, method and delegate of an app shares, whichever entry point
//! loads it (Rust, C++, or ExecuTorch's runtime).
//!
//! - the shared data cache (one copy of each named blob);
//! - the packed-weight caches: one in memory, and at most one per file (a second open of a file
//!   with other options is an error, not a silent reuse);
//! - XNNPACK's workspace sharing (off, per model, or global, as ExecuTorch's
//!   `workspace_sharing_mode`) and the thread pool.
//!
//! A [`Backend`] is a cheap handle (clones share everything). Each loaded model asks it for a
//! [`ModelContext`]: the packed-weight cache and workspace that model's delegates use.

use crate::cache::{CacheAccess, CacheError, CacheOptions, PackedWeightsCache};
use crate::deferred::DeferredData;
use crate::fast_hash::FastMap;
use crate::shared_data::SharedDataCache;
use crate::xnn::{
    AsXnnWeightsCache, InMemoryProvider, ProvidedWeightsCache, RuntimeOptions, Threadpool,
    Workspace, XnnError, XnnpackWeightsCache,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

/// How runtimes share XNNPACK's workspace (the memory their internal tensors live in), as
/// ExecuTorch's `workspace_sharing_mode` option: 0, 1, 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkspaceSharing {
    /// Each runtime has its own (ExecuTorch's default).
    #[default]
    Disabled,
    /// The runtimes of one model (all methods of a program) share one.
    PerModel,
    /// Every runtime of the backend shares one.
    Global,
}

impl WorkspaceSharing {
    /// ExecuTorch's code of the mode.
    pub fn code(self) -> i32 {
        match self {
            WorkspaceSharing::Disabled => 0,
            WorkspaceSharing::PerModel => 1,
            WorkspaceSharing::Global => 2,
        }
    }

    /// The mode of ExecuTorch's code.
    pub fn from_code(code: i64) -> Option<WorkspaceSharing> {
        Some(match code {
            0 => WorkspaceSharing::Disabled,
            1 => WorkspaceSharing::PerModel,
            2 => WorkspaceSharing::Global,
            _ => return None,
        })
    }
}

/// Where a model's packed weights live.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WeightsCacheChoice {
    /// The backend's in-memory cache, shared by every model loaded without a file: identical
    /// weights of two programs are packed once, nothing persists.
    #[default]
    InMemory,
    /// A file: the first launch packs and saves, later launches map it and pack nothing.
    File(PathBuf),
    /// The file `path`, under read-only caches made ahead of time (`xnnblob prepack`; files,
    /// or directories of them) that serve look-ups first: only what none holds is packed, into
    /// `path` (see [`CacheOptions::layers`](crate::cache::CacheOptions::layers)).
    Layered {
        /// The read-only layers, in the order they are consulted.
        layers: Vec<PathBuf>,
        /// The writable cache file.
        path: PathBuf,
    },
    /// No cache: XNNPACK packs every weight privately for each runtime.
    Disabled,
}

/// What resolving a packed-weight cache request has to say beside the weights
/// ([`Backend::resolve_weights`]).
#[derive(Debug)]
pub enum CacheNotice {
    /// The file's directory takes no new files: the file is used as it is, nothing is saved.
    ReadOnly {
        /// The cache file.
        path: PathBuf,
    },
    /// The file was not used whole (rejected, or entries that failed their checks): it is
    /// rebuilt at the next save.
    Rebuilt {
        /// The cache file.
        path: PathBuf,
        /// Why, as one sentence naming the file.
        why: String,
    },
    /// The path cannot be used: packed weights stay in memory for this process.
    Unusable {
        /// The path asked for.
        path: PathBuf,
        /// Why it cannot be used.
        error: CacheError,
    },
}

impl fmt::Display for CacheNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheNotice::ReadOnly { path } => write!(
                f,
                "packed-weight cache {}: its directory takes no new files; the cache is used as \
                 it is and nothing is saved",
                path.display()
            ),
            CacheNotice::Rebuilt { why, .. } => f.write_str(why),
            CacheNotice::Unusable { path, error } => write!(
                f,
                "packed-weight cache {}: {}; packed weights are kept in memory for this process \
                 instead",
                path.display(),
                crate::report::report(error)
            ),
        }
    }
}

/// The threads this machine runs at once (1 when it cannot tell): the thread count ExecuTorch's
/// own backend uses.
pub fn machine_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How a backend is set up.
#[derive(Debug, Clone, Default)]
pub struct BackendOptions {
    /// How the runtimes of the backend's models share XNNPACK's workspace.
    pub workspace_sharing: WorkspaceSharing,
    /// Threads XNNPACK splits operators across; 0 or 1: the calling thread only. The pool is
    /// xnnblob's own ([`Threadpool::new`]), which never waits for a thread that is not running.
    /// A delegate whose every operator is small runs on the calling thread whatever this says:
    /// waking the pool for each of its operators would cost more than they do.
    pub threads: usize,
    /// A pool to run on instead (for example the host runtime's own, [`Threadpool::with_ops`]);
    /// `threads` is then ignored.
    pub threadpool: Option<Arc<Threadpool>>,
    /// The packed-weight cache models use unless their load says otherwise.
    pub packed_cache: WeightsCacheChoice,
    /// What packed-weight cache files must match (this build and CPU by default).
    pub cache_options: CacheOptions,
    /// Leave packing to runtime creation, one weight after another on the loading thread, as
    /// XNNPACK does. By default, weights a packed-weight cache does not hold yet are packed
    /// ahead of creation on `threads` threads ([`crate::delegate::prepack`]).
    pub pack_serially: bool,
}

/// Why a backend or a model context could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// XNNPACK refused the workspace or the thread pool.
    #[error(transparent)]
    Xnn(#[from] XnnError),
    /// The packed-weight cache file could not be opened.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// An option has a value it cannot take.
    #[error("backend: option {name} cannot be {value}")]
    InvalidOption {
        /// The option, with the values it can take (e.g. `workspace_sharing_mode (0, 1 or 2)`).
        name: &'static str,
        /// The value it was given, as text.
        value: String,
    },
}

struct State {
    options: BackendOptions,
    shared: SharedDataCache,
    in_memory: Arc<PackedWeightsCache>,
    /// Held open for the backend's life, so models loaded one after another share them.
    files: Mutex<HashMap<PathBuf, Arc<PackedWeightsCache>>>,
    /// The paths [`Backend::resolve_weights`] resolved to a file cache, as they were asked for:
    /// asked again (a program of 62 delegates asks 62 times), they make no system call. Held by
    /// their bytes (a `Path`'s hash parses its components, and SipHash's each): another
    /// spelling of a path resolved before is resolved again, to the same cache.
    resolved: Mutex<FastMap<std::ffi::OsString, Arc<PackedWeightsCache>>>,
    /// With [`WorkspaceSharing::Global`].
    /// Made on first use by a model of global workspace sharing.
    global_workspace: OnceLock<Arc<Workspace>>,
    threadpool: Option<Arc<Threadpool>>,
    /// Placeholders of constants not read yet, one per content key while any delegate uses it.
    deferred: Mutex<Placeholders>,
}

/// The backend's placeholders by content key, and when dropped ones are next swept out.
#[derive(Default)]
struct Placeholders {
    /// Keyed by the same string the delegate holding the placeholder keeps (see
    /// [`Backend::deferred_constant_keyed`]): a key's bytes are stored once.
    entries: FastMap<Arc<str>, Weak<DeferredData>>,
    sweep_at: usize,
}

/// The backend-wide object. See the module documentation.
#[derive(Clone)]
pub struct Backend(Arc<State>);

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("options", &self.0.options)
            .finish_non_exhaustive()
    }
}

/// Asks, once per process, what every backend asks first and keeps: XNNPACK's initialisation
/// (its CPU detection), this CPU's fingerprint (packed-weight caches are checked against it)
/// and the hash's check of the CPU's instructions. Each takes a few `cpuid` instructions, which
/// a virtual machine traps (0.1-0.2 ms in all): a host that calls this when its library is
/// loaded, as ExecuTorch's backend initialises XNNPACK, takes them out of its first model's
/// load. Idempotent and thread-safe; a failure of XNNPACK's initialisation is kept and
/// reported by the first [`Backend::new`].
pub fn prepare_process() {
    let _ = crate::xnn::initialize();
    let _ = crate::cache::cpu_fingerprint();
    let _ = crate::sha256::sha256(&[]);
}

impl Backend {
    /// A backend set up as `options` say: initialises XNNPACK (once per process) and makes the
    /// global workspace and the thread pool if the options ask for them.
    pub fn new(options: BackendOptions) -> Result<Backend, BackendError> {
        crate::xnn::initialize()?;
        let global_workspace = OnceLock::new();
        if options.workspace_sharing == WorkspaceSharing::Global {
            let _ = global_workspace.set(Arc::new(Workspace::new()?));
        }
        let threadpool = match (&options.threadpool, options.threads) {
            (Some(pool), _) => Some(pool.clone()),
            (None, 0 | 1) => None,
            (None, n) => Some(Arc::new(Threadpool::new(n)?)),
        };
        Ok(Backend(Arc::new(State {
            options,
            shared: SharedDataCache::new(),
            in_memory: PackedWeightsCache::in_memory(),
            files: Mutex::new(HashMap::new()),
            resolved: Mutex::new(FastMap::default()),
            global_workspace,
            threadpool,
            deferred: Mutex::new(Placeholders::default()),
        })))
    }

    /// A backend with the default options: no workspace sharing, the calling thread, the
    /// in-memory packed-weight cache.
    pub fn with_defaults() -> Result<Backend, BackendError> {
        Backend::new(BackendOptions::default())
    }

    /// The options the backend was made with.
    pub fn options(&self) -> &BackendOptions {
        &self.0.options
    }

    /// The shared data cache every model of this backend loads named data through.
    pub fn shared_data(&self) -> &SharedDataCache {
        &self.0.shared
    }

    /// The in-memory packed-weight cache models without a file share.
    pub fn in_memory_cache(&self) -> &Arc<PackedWeightsCache> {
        &self.0.in_memory
    }

    /// The packed-weight cache of the file at `path`, opened once for this backend (and once per
    /// process: another backend opening the same file gets the same cache, if it asks for the
    /// same options).
    pub fn file_cache(&self, path: &Path) -> Result<Arc<PackedWeightsCache>, CacheError> {
        self.layered_cache(&[], path)
    }

    /// As [`file_cache`](Self::file_cache), under the read-only `layers` (see
    /// [`WeightsCacheChoice::Layered`]). A file opened before with other layers is
    /// [`CacheError::OpenWithOtherOptions`].
    pub fn layered_cache(
        &self,
        layers: &[PathBuf],
        path: &Path,
    ) -> Result<Arc<PackedWeightsCache>, CacheError> {
        self.layered_cache_vetted(layers, path, None)
    }

    /// As [`layered_cache`](Self::layered_cache), with `path` as
    /// [`PackedWeightsCache::access_vetted`] vetted it, if it did.
    fn layered_cache_vetted(
        &self,
        layers: &[PathBuf],
        path: &Path,
        vetted: Option<PathBuf>,
    ) -> Result<Arc<PackedWeightsCache>, CacheError> {
        let mut files = self.0.files.lock();
        if let Some(cache) = files.get(path) {
            if cache.layers() != layers {
                return Err(CacheError::OpenWithOtherOptions {
                    path: path.to_path_buf(),
                });
            }
            return Ok(cache.clone());
        }
        let mut options = self.0.options.cache_options.clone();
        options.layers = layers.to_vec();
        let cache = match vetted {
            Some(vetted) => PackedWeightsCache::open_vetted(vetted, options)?,
            None => PackedWeightsCache::open_with(path, options)?,
        };
        files.insert(path.to_path_buf(), cache.clone());
        Ok(cache)
    }

    /// Whether `request` names a cache file this backend resolved before, which
    /// [`resolve_weights`](Self::resolve_weights) then hands over asking nothing of the file
    /// system.
    pub fn has_resolved(&self, request: &WeightsCacheChoice) -> bool {
        let (layers, path) = match request {
            WeightsCacheChoice::File(path) => (&[][..], path),
            WeightsCacheChoice::Layered { layers, path } => (&layers[..], path),
            WeightsCacheChoice::InMemory | WeightsCacheChoice::Disabled => return false,
        };
        self.resolved(layers, path).is_some()
    }

    /// The cache this backend resolved before for the file `path` under `layers`, if any.
    fn resolved(&self, layers: &[PathBuf], path: &Path) -> Option<Arc<PackedWeightsCache>> {
        self.0
            .resolved
            .lock()
            .get(path.as_os_str())
            .filter(|c| c.layers() == layers)
            .cloned()
    }

    /// The weights `request` names, resolved as every face resolves them (ExecuTorch's options,
    /// the command line's flags, the C++ and C faces' arguments):
    /// - a file whose directory takes no new files (a read-only mount, an app's bundle) is used
    ///   as it is, and nothing is saved ([`CacheNotice::ReadOnly`]);
    /// - a file that was rejected or lost entries is rebuilt at the next save
    ///   ([`CacheNotice::Rebuilt`]);
    /// - a path that cannot be used at all (no permission, a directory, a user's file) leaves
    ///   the packed weights in the backend's in-memory cache ([`CacheNotice::Unusable`]); a face
    ///   that must persist turns that notice into its error;
    /// - with `verify_on_load`, every packed weight of the file is checked before any runtime
    ///   uses it;
    /// - a path resolved before by this backend gives the same cache again, with no notice and
    ///   no system call (ExecuTorch's runtime asks once per delegate).
    ///
    /// The notice is the face's to say, in its own way (ExecuTorch's log, stderr, an error).
    pub fn resolve_weights(
        &self,
        request: &WeightsCacheChoice,
        verify_on_load: bool,
    ) -> (Weights, Option<CacheNotice>) {
        let (layers, path) = match request {
            WeightsCacheChoice::Disabled => return (Weights::None, None),
            WeightsCacheChoice::InMemory => {
                return (Weights::Packed(self.0.in_memory.clone()), None);
            }
            WeightsCacheChoice::File(path) => (&[][..], path),
            WeightsCacheChoice::Layered { layers, path } => (&layers[..], path),
        };
        if let Some(cache) = self.resolved(layers, path) {
            // Resolved before: the same cache, and its notice was given then.
            if verify_on_load {
                cache.verify_before_use();
            }
            return (Weights::Packed(cache), None);
        }
        let opened = PackedWeightsCache::access_vetted(path).and_then(|(access, vetted)| {
            Ok((access, self.layered_cache_vetted(layers, path, vetted)?))
        });
        let (access, cache) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                let notice = CacheNotice::Unusable {
                    path: path.clone(),
                    error,
                };
                return (Weights::Packed(self.0.in_memory.clone()), Some(notice));
            }
        };
        if verify_on_load {
            cache.verify_before_use();
        }
        self.0
            .resolved
            .lock()
            .insert(path.as_os_str().to_owned(), cache.clone());
        let notice = if access == CacheAccess::ReadOnly {
            cache.keep_read_only();
            Some(CacheNotice::ReadOnly { path: path.clone() })
        } else {
            // A layer that was not used is said with the file's own note, if it has one.
            let notes: Vec<String> = cache
                .load_note()
                .into_iter()
                .chain(cache.layer_note())
                .collect();
            (!notes.is_empty()).then(|| CacheNotice::Rebuilt {
                path: path.clone(),
                why: notes.join("; "),
            })
        };
        (Weights::Packed(cache), notice)
    }

    /// The placeholder ([`DeferredData`]) standing for the constant with content key `key` and
    /// `len` bytes: one per key across the backend while any delegate holds it, so programs
    /// sharing a weight share one address (and one packed entry).
    pub fn deferred_constant(&self, key: &str, len: usize) -> std::io::Result<Arc<DeferredData>> {
        self.deferred_constant_keyed(key, len).map(|(_, d)| d)
    }

    /// Room in the placeholders' table for `more` keys: a delegate of a thousand deferred
    /// weights would otherwise grow it (hashing every key again) ten times.
    pub(crate) fn reserve_placeholders(&self, more: usize) {
        self.0.deferred.lock().entries.reserve(more);
    }

    /// As [`deferred_constant`](Self::deferred_constant), with the key as the table stores it,
    /// for a caller that keeps the key too: a decoder's 170 placeholders kept each key twice.
    pub(crate) fn deferred_constant_keyed(
        &self,
        key: &str,
        len: usize,
    ) -> std::io::Result<(Arc<str>, Arc<DeferredData>)> {
        let mut table = self.0.deferred.lock();
        let found = table
            .entries
            .get_key_value(key)
            .map(|(stored, weak)| (stored.clone(), weak.upgrade()));
        let key = match found {
            Some((stored, Some(d))) if d.len() == len => return Ok((stored, d)),
            // One key, two lengths: not the same content, so not shared.
            Some((stored, Some(_))) => return Ok((stored, Arc::new(DeferredData::reserve(len)?))),
            // Its placeholder was dropped: the entry takes a new one, under the same key.
            Some((stored, None)) => stored,
            None => Arc::from(key),
        };
        let d = Arc::new(DeferredData::reserve(len)?);
        // Entries of dropped placeholders are swept when the table has doubled since the last
        // sweep: sweeping at every insertion made a thousand-weight load quadratic.
        if table.entries.len() >= table.sweep_at {
            table.entries.retain(|_, w| w.strong_count() > 0);
            table.sweep_at = (table.entries.len() * 2).max(64);
        }
        table.entries.insert(key.clone(), Arc::downgrade(&d));
        Ok((key, d))
    }

    /// The packed-weight caches this backend holds open: the in-memory one, then each file.
    pub fn packed_caches(&self) -> Vec<Arc<PackedWeightsCache>> {
        let mut all = vec![self.0.in_memory.clone()];
        all.extend(self.0.files.lock().values().cloned());
        all
    }

    /// The context a new model's delegates share: the packed-weight cache `cache` names (the
    /// backend's default when None), and a workspace as the sharing mode says.
    ///
    /// The weights are [`resolve_weights`](Self::resolve_weights)'s, and a path that cannot be
    /// used is this call's error: the caller named a file and expects it to persist.
    ///
    /// The model's files are not known here, so a cache file it uses is created no more
    /// readable than [`PRIVATE_MODE`](crate::cache::PRIVATE_MODE) (see
    /// [`model_for_files`](Self::model_for_files)).
    pub fn model(&self, cache: Option<&WeightsCacheChoice>) -> Result<ModelContext, BackendError> {
        self.model_for_files(cache, crate::cache::PRIVATE_MODE)
    }

    /// As [`model`](Self::model), for a model whose files (its `.pte` and `.ptd`) all allow the
    /// permission bits `files_mode` (the bits they have in common): the packed-weight cache it
    /// uses creates its files no more readable than that
    /// ([`PackedWeightsCache::limit_permissions`]).
    pub fn model_for_files(
        &self,
        cache: Option<&WeightsCacheChoice>,
        files_mode: u32,
    ) -> Result<ModelContext, BackendError> {
        let request = cache.unwrap_or(&self.0.options.packed_cache);
        let weights = match self.resolve_weights(request, false) {
            (_, Some(CacheNotice::Unusable { error, .. })) => return Err(error.into()),
            (weights, _) => weights,
        };
        if let Weights::Packed(cache) = &weights {
            cache.limit_permissions(files_mode);
        }
        self.model_with_weights(weights)
    }

    /// As [`model`](Self::model), with any weights cache (XNNPACK's own, a provider).
    pub fn model_with_weights(&self, weights: Weights) -> Result<ModelContext, BackendError> {
        self.model_with_workspace(weights, self.0.options.workspace_sharing)
    }

    /// As [`model_with_weights`](Self::model_with_weights), with this model's own workspace
    /// sharing (ExecuTorch sets it per load).
    pub fn model_with_workspace(
        &self,
        weights: Weights,
        sharing: WorkspaceSharing,
    ) -> Result<ModelContext, BackendError> {
        let workspace = match sharing {
            WorkspaceSharing::Disabled => None,
            WorkspaceSharing::PerModel => Some(Arc::new(Workspace::new()?)),
            WorkspaceSharing::Global => Some(match self.0.global_workspace.get() {
                Some(w) => w.clone(),
                None => {
                    let made = Arc::new(Workspace::new()?);
                    self.0.global_workspace.get_or_init(|| made).clone()
                }
            }),
        };
        Ok(ModelContext {
            backend: self.clone(),
            weights,
            runtime: RuntimeOptions {
                workspace,
                threadpool: self.0.threadpool.clone(),
                keep_node_order: false,
            },
        })
    }
}

/// What the delegates of one model (a program's methods, or payloads a C++ author loads
/// together) share: the backend, a packed-weight cache, a workspace.
#[derive(Clone)]
pub struct ModelContext {
    backend: Backend,
    weights: Weights,
    runtime: RuntimeOptions,
}

impl ModelContext {
    /// The backend the model was loaded through.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The weights cache the model's runtimes use.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// xnnblob's packed-weight cache, when the model uses one.
    pub fn packed_cache(&self) -> Option<&Arc<PackedWeightsCache>> {
        match &self.weights {
            Weights::Packed(c) => Some(c),
            _ => None,
        }
    }

    /// The workspace and thread pool the model's runtimes are created with.
    pub fn runtime_options(&self) -> &RuntimeOptions {
        &self.runtime
    }

    /// How many threads the model runs (and packs) on: its pool's, now.
    pub fn threads(&self) -> usize {
        self.runtime.threadpool.as_ref().map_or(1, |p| p.threads())
    }

    /// The same context with runtimes that run on the calling thread alone (ExecuTorch's
    /// backend under a `NoThreadPoolGuard`).
    pub fn without_threadpool(mut self) -> ModelContext {
        self.runtime.threadpool = None;
        self
    }

    /// Whether weights missing from the packed-weight cache are packed ahead of runtime
    /// creation, in parallel, where the pool has more than one thread (its size asked only
    /// when some are missing).
    pub fn packs_ahead(&self) -> bool {
        !self.backend.0.options.pack_serially
    }
}

/// The weights cache a delegate's runtime uses.
#[derive(Clone, Default)]
pub enum Weights {
    /// None: XNNPACK packs every weight privately.
    #[default]
    None,
    /// xnnblob's packed-weight cache (persistent or in memory).
    Packed(Arc<PackedWeightsCache>),
    /// XNNPACK's own in-memory cache.
    Xnnpack(Arc<XnnpackWeightsCache>),
    /// A pointer-keyed in-memory provider (a benchmark's floor: every look-up hits once it
    /// holds the weights of the same buffers).
    Provider(Arc<ProvidedWeightsCache<InMemoryProvider>>),
}

impl Weights {
    /// The cache as XNNPACK takes it, if any.
    pub(crate) fn as_xnn(&self) -> Option<&dyn AsXnnWeightsCache> {
        match self {
            Weights::None => None,
            Weights::Packed(c) => Some(&**c),
            Weights::Xnnpack(c) => Some(&**c),
            Weights::Provider(c) => Some(&**c),
        }
    }
}
