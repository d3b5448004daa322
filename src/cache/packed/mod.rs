//! The packed-weight cache behind XNNPACK's weights-cache provider: registration of unpacked
//! data by content, look-up and insertion from XNNPACK, the file it loads and saves.

use super::checked;
use super::checksum::checksum64;
use super::core::{CacheCore, DraftPlan, Location};
use super::error::CacheError;
use super::format::{Compat, FileError};
use super::identity::BlobId;
use super::layers::{self, LayerOutcome, PendingCheck};
use super::options::{CacheOptions, KeyTrust, VerifyPacked};
use super::persist::{self, FileReport, LoadOutcome};
use super::saver::{
    PACKING_PAUSE, Saver, spawn_saver, wait_for_inference_to_pause, yield_to_inference,
};
use super::stats::{BadEntry, CacheStats};
use crate::deferred::{DeferredData, Fill};
use crate::mmap::{FileIdentity, MappedFile};
use crate::named_data::DataBuffer;
use crate::xnn::{AsXnnWeightsCache, ProvidedWeightsCache};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

mod registration;
mod vetting;

pub use registration::{OwnedRegistration, Registration};
use vetting::vetted;

/// A packed-weight cache, persistent (one file) or in memory; an `xnn_weights_cache_t` for
/// `xnn_create_runtime_v4` through [`AsXnnWeightsCache`].
///
/// Lifecycle: create runtimes, then [`finalize`](Self::finalize) (which saves what was packed),
/// then set them up. The first `finalize` enables setup; afterwards runtimes may be created and
/// set up at any time (packed memory never moves), and each later `finalize` saves again.
pub struct PackedWeightsCache {
    xnn: ProvidedWeightsCache<Arc<CacheCore>>,
    path: Option<PathBuf>,
    compat: Compat,
    outcome: LoadOutcome,
    blocking_save: bool,
    /// The save in progress, and what became of the last one.
    saver: Mutex<Saver>,
    saves: Arc<AtomicUsize>,
    /// What it was opened with (a second open must ask for the same).
    options: CacheOptions,
    /// Used as it is and never written ([`keep_read_only`](Self::keep_read_only)).
    read_only: AtomicBool,
    /// The file as opened, when its packed bytes are still to be checked in the background:
    /// none were checked since it last changed (see `checked.rs`).
    to_check: Option<Arc<MappedFile>>,
    /// The permission bits the files this cache creates may have (see
    /// [`limit_permissions`](Self::limit_permissions)); [`NO_LIMIT`] until a model says.
    /// Shared with the saving thread, which reads it at each save.
    mode_limit: Arc<AtomicU32>,
    /// Bits the file had beyond a limit, when that limit was set.
    excess_permissions: AtomicU32,
    /// For a file that cannot be written and is still to be checked: where to remember what
    /// the check finds (see `checked::elsewhere_path`), until the check is started.
    remember_at: Mutex<Option<PathBuf>>,
    /// What became of each read-only layer (see `layers.rs`).
    layer_outcomes: Vec<LayerOutcome>,
    /// Layers to check after the launch, until the check is started.
    layer_checks: Arc<Mutex<Vec<PendingCheck>>>,
}

/// No model has limited a cache's permission bits yet: its files are created
/// [`PRIVATE_MODE`](super::PRIVATE_MODE).
const NO_LIMIT: u32 = u32::MAX;

/// The read and write bits of a mode (a cache file is never executable).
const READ_WRITE: u32 = 0o666;

/// Whether a cache file at a path can be saved, or only used as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheAccess {
    /// Its directory takes new files: the file is used and saved.
    ReadWrite,
    /// A cache file is there but its directory (or file system) takes no new files: it is used
    /// as it is, and nothing is saved (an app's read-only bundle, a read-only mount).
    ReadOnly,
}

/// The permission bits files are created with under `limit` (a [`PackedWeightsCache`]'s).
fn mode_of_limit(limit: u32) -> u32 {
    if limit == NO_LIMIT {
        crate::side_file::PRIVATE_MODE
    } else {
        limit & READ_WRITE
    }
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<PackedWeightsCache>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Weak<PackedWeightsCache>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl PackedWeightsCache {
    /// The cache backed by the file at `path` (created on the first save). A file is loaded at
    /// most once per process: opening a path that is open already returns the same cache, if
    /// the options are the same ([`CacheError::OpenWithOtherOptions`] otherwise).
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<PackedWeightsCache>, CacheError> {
        PackedWeightsCache::open_with(path, CacheOptions::default())
    }

    /// As [`open`](Self::open), with `options` overriding the build and CPU a file must match,
    /// or making saves blocking.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: CacheOptions,
    ) -> Result<Arc<PackedWeightsCache>, CacheError> {
        PackedWeightsCache::open_vetted(vetted(path.as_ref())?, options)
    }

    /// As [`open_with`](Self::open_with), of a path [`vetted`] just now.
    pub(crate) fn open_vetted(
        path: PathBuf,
        options: CacheOptions,
    ) -> Result<Arc<PackedWeightsCache>, CacheError> {
        crate::xnn::initialize().ok();
        let mut reg = registry().lock();
        if let Some(existing) = reg.get(&path).and_then(Weak::upgrade) {
            if existing.options != options {
                return Err(CacheError::OpenWithOtherOptions { path });
            }
            return Ok(existing);
        }
        let compat = options.compat();
        let core = CacheCore::default();
        let mode_limit = Arc::new(AtomicU32::new(NO_LIMIT));
        // Temporaries of saves killed midway are reclaimed here too, not only by a save: a
        // process that never saves again (every later launch warm) would keep them forever. A
        // temporary whose writer is gone can never be published, so no lock is needed. The
        // directory is read only when a writer of this file began since the file was put in
        // place or its check recorded (the writer lock's time says so): a warm launch in an
        // app's directory of many files lists none of them, however often the app's other
        // files change. A reading that leaves nothing of a save there is noted in the check
        // record's time, so that a writer that finished costs one launch a reading, not every
        // launch after it.
        let storage = options.storage.get();
        let side_files = [super::checked::record_path(&path)];
        if persist::writer_began_since_written(&path, &side_files)
            && crate::publish::reclaim_abandoned(storage, &path, false).kept == 0
        {
            checked::mark_directory_read(&path);
        }
        let outcome = persist::load(&core, storage, &path, &compat, options.prefetch)?;
        if options.verify == VerifyPacked::BeforeUse {
            core.forget_corrupt(true);
        }
        let loaded = core.state.lock().maps.first().cloned();
        // After the cache's own file, which must be map 0 when it loaded (see `forget_at`).
        let (layer_outcomes, layer_checks) = layers::load(
            &core,
            storage,
            &options.layers,
            &compat,
            options.state_dir.as_deref(),
        );
        // A file recorded as checked as it is now has every entry's bytes checked: the kept
        // constants a launch reads at once (a delegate's remembered identities) are not hashed
        // again at each read.
        let background = options.verify == VerifyPacked::Background;
        let recorded = background
            && loaded
                .as_ref()
                .is_some_and(|map| checked::is_recorded(&path, map));
        if recorded {
            core.mark_checked();
        }
        let to_check = loaded.filter(|_| background && !recorded);
        let cache = Arc::new(PackedWeightsCache {
            xnn: ProvidedWeightsCache::new(Arc::new(core)),
            path: Some(path.clone()),
            compat,
            outcome,
            blocking_save: options.blocking_save,
            saver: Mutex::new(Saver::default()),
            saves: Arc::new(AtomicUsize::new(0)),
            options,
            read_only: AtomicBool::new(false),
            to_check,
            mode_limit: mode_limit.clone(),
            excess_permissions: AtomicU32::new(0),
            remember_at: Mutex::new(None),
            layer_outcomes,
            layer_checks: Arc::new(Mutex::new(layer_checks)),
        });
        // XNNPACK packs straight into a draft of the file once the heap holds `heap_first`
        // packed bytes (see `packing_file.rs`); a cache kept read-only packs on the heap instead.
        cache.core().state.lock().drafting = Some(DraftPlan {
            storage: cache.options.storage.clone(),
            destination: path.clone(),
            mode: Box::new(move || mode_of_limit(mode_limit.load(Ordering::Relaxed))),
            heap_first: cache.options.heap_first.0,
        });
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(path, Arc::downgrade(&cache));
        Ok(cache)
    }

    /// A cache with no file: the same behaviour within this process, nothing persisted.
    pub fn in_memory() -> Arc<PackedWeightsCache> {
        Arc::new(PackedWeightsCache {
            xnn: ProvidedWeightsCache::new(Arc::new(CacheCore::default())),
            path: None,
            compat: CacheOptions::default().compat(),
            outcome: LoadOutcome::Fresh,
            blocking_save: true,
            saver: Mutex::new(Saver::default()),
            saves: Arc::new(AtomicUsize::new(0)),
            options: CacheOptions::default(),
            read_only: AtomicBool::new(false),
            to_check: None,
            mode_limit: Arc::new(AtomicU32::new(NO_LIMIT)),
            excess_permissions: AtomicU32::new(0),
            remember_at: Mutex::new(None),
            layer_outcomes: Vec::new(),
            layer_checks: Arc::new(Mutex::new(Vec::new())),
        })
    }

    fn core(&self) -> &Arc<CacheCore> {
        self.xnn.provider()
    }

    /// The canonical path of the cache file; None for an [`in_memory`](Self::in_memory) cache.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// What a user should hear, once, about the file this cache opened: why a whole file was
    /// rejected (stale build, another CPU, torn, checksum), or how many entries failed their
    /// checks. None when the file was valid or absent.
    pub fn load_note(&self) -> Option<String> {
        let path = self.path.as_ref()?.display();
        match &self.outcome {
            LoadOutcome::Rejected(why) => Some(format!(
                "packed-weight cache {path} was rejected ({why}); it is rebuilt at the next save"
            )),
            LoadOutcome::Loaded { dropped, .. } if *dropped > 0 => Some(format!(
                "packed-weight cache {path}: {dropped} entries failed their checks; they are \
                 repacked and rewritten at the next save"
            )),
            _ => None,
        }
    }

    /// What opening the file found.
    pub fn load_outcome(&self) -> &LoadOutcome {
        &self.outcome
    }

    /// Whether this process found no packed weight to serve when it opened the cache: a file
    /// with a path that was absent, rejected or empty, and no read-only layer. Every weight a
    /// launch asks of such a cache is packed in that launch.
    pub fn opened_empty(&self) -> bool {
        self.path.is_some()
            && self.layers().is_empty()
            && matches!(
                self.outcome,
                LoadOutcome::Fresh
                    | LoadOutcome::Rejected(_)
                    | LoadOutcome::Loaded { entries: 0, .. }
            )
    }

    /// Limits the permission bits of the files this cache creates from now on (the cache file
    /// at each save, its `.lock` and `.checked` siblings, its temporaries) to those of `mode`:
    /// a model's packed weights are never more readable than the model's own files. Each model
    /// that uses the cache gives the bits its files have in common (`Program::load` does); a
    /// face that cannot know them gives [`PRIVATE_MODE`](super::PRIVATE_MODE). Limits only
    /// narrow, so a cache shared by several models is no more readable than any of them; until
    /// the first, files are created [`PRIVATE_MODE`](super::PRIVATE_MODE). The umask applies as
    /// well, and no file is ever created executable.
    ///
    /// A file already at the path with bits beyond the limit is used as it is, and counted in
    /// [`CacheStats::excess_permissions`] ([`permissions_note`](Self::permissions_note) says it).
    pub fn limit_permissions(&self, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let mode = mode & READ_WRITE;
        let before = self.mode_limit.fetch_and(mode, Ordering::Relaxed);
        let limit = before & mode;
        // Asked again with no narrower limit (every delegate of a program asks): nothing new
        // to compare, and no system call.
        if limit == before {
            return;
        }
        let Some(path) = &self.path else { return };
        if let Ok(m) = std::fs::symlink_metadata(path) {
            let excess = m.permissions().mode() & READ_WRITE & !limit;
            if m.is_file() && excess != 0 {
                self.excess_permissions.fetch_or(excess, Ordering::Relaxed);
            }
        }
    }

    /// The permission bits this cache creates its files with now (less the umask): the
    /// narrowest limit given (see [`limit_permissions`](Self::limit_permissions)).
    pub fn file_mode(&self) -> u32 {
        mode_of_limit(self.mode_limit.load(Ordering::Relaxed))
    }

    /// What a user should hear, once, when the cache file was found more readable than a
    /// model that uses it allows ([`CacheStats::excess_permissions`]); None otherwise.
    pub fn permissions_note(&self) -> Option<String> {
        let excess = self.excess_permissions.load(Ordering::Relaxed);
        let path = self.path.as_ref().filter(|_| excess != 0)?;
        let allowed = self.file_mode();
        Some(format!(
            "packed-weight cache {path} is more readable than the model it was packed from \
             allows: it has permission bits {excess:04o} beyond {allowed:04o} (the bits of the \
             model's files, or 0600 where they are not known). It is used as it is; `chmod \
             {allowed:o} {path}` narrows it",
            path = path.display()
        ))
    }

    /// Whether `file`'s named keys must be checked against its bytes before they are taken as
    /// identities: [`KeyTrust::CheckEachFile`] and no check of this file recorded yet.
    pub fn must_check_keys_of(&self, file: &FileIdentity) -> bool {
        self.options.key_trust == KeyTrust::CheckEachFile
            && !self.core().state.lock().sources.contains(file)
    }

    /// Records the outcome of checking `file`'s keys: `mismatches` keys did not match their
    /// bytes. A file whose keys all matched is saved as checked (the next save writes it even
    /// with no new entry); one with a mismatch is checked again at every launch.
    pub fn keys_checked(&self, file: FileIdentity, mismatches: usize) {
        if mismatches == 0 {
            self.core().state.lock().add_source(file);
        } else {
            self.core()
                .counters
                .key_mismatches
                .fetch_add(mismatches, Ordering::Relaxed);
        }
    }

    /// Enables runtime setup and saves what was packed since the last save, on a background
    /// thread (or here, with `blocking_save`); nothing new to save writes nothing. Safe to call
    /// any number of times. A background save that fails is given up for the rest of the
    /// process (no later `finalize` saves, so a held lock or a full disk costs one wait, not one
    /// per model): its error is reported once, by [`wait_saved`](Self::wait_saved), and costs
    /// only a repack at the next launch.
    pub fn finalize(&self) -> Result<(), CacheError> {
        self.core().finalized.store(true, Ordering::Release);
        self.core().release_staging();
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        if self.read_only.load(Ordering::Relaxed) {
            self.check_and_remember(path);
            return Ok(());
        }
        // Checked in the background only while no check was recorded since the file last
        // changed (see `save_pass`).
        let verify = self.to_check.is_some()
            && self.options.verify == VerifyPacked::Background
            && !self.blocking_save;
        if self.blocking_save {
            return self.save_pass(path)();
        }
        let mut saver = self.saver.lock();
        {
            let mut queue = saver.queue.lock();
            if queue.given_up {
                return Ok(());
            }
            if queue.running {
                // The save in progress goes once more when it ends, with everything new by
                // then: a program of 62 delegates, each finalizing at init, saves two or three
                // times, not 62 (each a whole file).
                queue.again = true;
                return Ok(());
            }
            let unsaved = self.core().has_unsaved();
            let to_check = verify && self.core().has_unchecked(true);
            if !unsaved && !to_check && self.layer_checks.lock().is_empty() {
                return Ok(());
            }
            queue.running = true;
        }
        if let Some(finished) = saver.thread.take() {
            finished.join();
        }
        let shown = path.display().to_string();
        let save = self.save_pass(path);
        let queue = saver.queue.clone();
        let hurry = saver.hurry.clone();
        let packing = self.core().clone();
        saver.thread = Some(spawn_saver(move || {
            yield_to_inference();
            loop {
                // Until packing pauses, or someone waits for the save.
                loop {
                    let packed = packing.counters.reserve_space_calls.load(Ordering::Relaxed);
                    let mut q = queue.lock();
                    if !q.hurried {
                        hurry.wait_for(&mut q, PACKING_PAUSE);
                    }
                    let unchanged =
                        packing.counters.reserve_space_calls.load(Ordering::Relaxed) == packed;
                    if q.hurried || unchanged {
                        break;
                    }
                }
                wait_for_inference_to_pause(&queue, &hurry);
                // A panic in a save ends this thread's saves as an error would, never leaving
                // `running` set for a thread that is gone.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&save))
                    .unwrap_or_else(|_| {
                        Err(CacheError::Io {
                            path: shown.clone(),
                            error: std::io::Error::other("a save panicked"),
                        })
                    });
                let mut q = queue.lock();
                if let Err(e) = result {
                    q.failed = Some(e);
                    q.given_up = true;
                    q.again = false;
                }
                if !std::mem::take(&mut q.again) {
                    q.running = false;
                    return;
                }
            }
        }));
        Ok(())
    }

    /// The pass a save makes (see [`finalize`](Self::finalize)): what is new now saved and,
    /// in the background, the file and the read-only layers not checked yet checked. Made only
    /// when there is something to do: a warm launch's delegates finalize one by one, and most
    /// have nothing to save.
    fn save_pass(
        &self,
        path: PathBuf,
    ) -> impl Fn() -> Result<(), CacheError> + Send + 'static + use<> {
        let (core, compat, saves) = (self.core().clone(), self.compat.clone(), self.saves.clone());
        let storage = self.options.storage.clone();
        let budget = self.options.budget;
        // Checked in the background only while no check was recorded since the file last
        // changed: then every entry, once, so that the record can be made.
        let to_check = self
            .to_check
            .clone()
            .filter(|_| self.options.verify == VerifyPacked::Background && !self.blocking_save);
        // With background checks, what a save writes is recorded as checked.
        let record_saves = self.options.verify == VerifyPacked::Background && !self.blocking_save;
        let checked_path = path.clone();
        let mode_limit = self.mode_limit.clone();
        let layer_checks = self.layer_checks.clone();
        // One pass: what is new now (and, in the background, the check of the file and of the
        // read-only layers not checked yet).
        move || -> Result<(), CacheError> {
            let pending = std::mem::take(&mut *layer_checks.lock());
            if !pending.is_empty() {
                let damaged = layers::check(&core, pending);
                core.counters
                    .corrupt_after_use
                    .fetch_add(damaged, Ordering::Relaxed);
            }
            let unsaved = core.has_unsaved();
            // Read at each pass: a model loaded since the save was asked for may have narrowed it.
            let mode = mode_of_limit(mode_limit.load(Ordering::Relaxed));
            // A damaged entry found here is left out of the file the save writes.
            let corrupt = match &to_check {
                Some(map) if core.has_unchecked(true) => {
                    let before = checked::before_check(&checked_path, map);
                    let corrupt = core.forget_corrupt(true);
                    core.counters
                        .corrupt_after_use
                        .fetch_add(corrupt, Ordering::Relaxed);
                    if let (0, Some(before)) = (corrupt, before) {
                        checked::record(&checked_path, map, before, mode);
                    }
                    corrupt
                }
                _ => 0,
            };
            if unsaved || corrupt > 0 {
                let saved = persist::save(&core, storage.get(), &path, &compat, budget, mode)?;
                core.counters
                    .evicted
                    .fetch_add(saved.evicted, Ordering::Relaxed);
                saves.fetch_add(1, Ordering::Relaxed);
                if record_saves {
                    // Every byte a save writes was checked as it was written (packed here, or
                    // copied only if it matched its checksum): the new file needs no check by
                    // the launches after this one. Recorded once its clock has ticked past the
                    // write (a few ms on ext4), so that any later change shows.
                    let written = core.state.lock().maps.last().cloned();
                    if let Some(map) = written {
                        std::thread::sleep(checked::settle_time(&checked_path));
                        if let Some(before) = checked::before_check(&checked_path, &map) {
                            checked::record(&checked_path, &map, before, mode);
                        }
                    }
                }
            }
            Ok(())
        }
    }

    /// Uses the file as it is from now on: nothing this process packs is saved (see
    /// [`CacheAccess::ReadOnly`]). Call it before any runtime is created with the cache.
    ///
    /// Damage in such a file cannot be repaired, so it is remembered where the user can write
    /// ([`CacheOptions::state_dir`]), and served at most once: with
    /// [`VerifyPacked::Background`], entries a record of an earlier check names are forgotten
    /// now (nothing is read); a file with no record of its current status is checked after
    /// the launch, and what is found is recorded. Where nothing can be recorded (no state
    /// directory, a record path that cannot be written as a regular file, a file changed
    /// within its settle time), the file is checked now, before use (every packed byte is
    /// read). A warm launch with a record costs one small read.
    pub fn keep_read_only(&self) {
        if self.read_only.swap(true, Ordering::Relaxed) {
            return;
        }
        self.core().state.lock().drafting = None;
        let (Some(path), Some(map)) = (&self.path, &self.to_check) else {
            return;
        };
        match checked::elsewhere_path(path, self.options.state_dir.as_deref()) {
            Some(record) => match checked::remembered_damage(&record, path, map) {
                Some(damaged) => {
                    self.core().forget_at(&damaged);
                    self.core().mark_checked();
                }
                None if checked::can_remember(&record, path, map) => {
                    *self.remember_at.lock() = Some(record)
                }
                // A check after the launch could not be remembered: checked now.
                None => {
                    self.core().forget_corrupt(true);
                }
            },
            None => {
                self.core().forget_corrupt(true);
            }
        }
    }

    /// For a read-only file still to be checked ([`keep_read_only`](Self::keep_read_only)):
    /// checks every entry on a background thread (as a save would, at low priority, waited for
    /// by [`wait_saved`](Self::wait_saved)), forgets the damaged ones, and remembers them.
    fn check_and_remember(&self, path: PathBuf) {
        let own = self.remember_at.lock().take().zip(self.to_check.clone());
        let layers = std::mem::take(&mut *self.layer_checks.lock());
        if own.is_none() && layers.is_empty() {
            return;
        }
        let core = self.core().clone();
        let mut saver = self.saver.lock();
        if let Some(finished) = saver.thread.take() {
            finished.join();
        }
        let (queue, hurry) = (saver.queue.clone(), saver.hurry.clone());
        saver.thread = Some(spawn_saver(move || {
            yield_to_inference();
            wait_for_inference_to_pause(&queue, &hurry);
            let mut damaged_count = layers::check(&core, layers);
            if let Some((record, map)) = own {
                let before = checked::before_check(&path, &map);
                let damaged = core.forget_corrupt_at(true);
                damaged_count += damaged.len();
                let remembered = before.is_some_and(|before| {
                    checked::remember_damage(&record, &path, &map, before, &damaged)
                });
                if !remembered && !damaged.is_empty() {
                    core.counters
                        .damage_not_remembered
                        .fetch_add(damaged.len(), Ordering::Relaxed);
                }
            }
            core.counters
                .corrupt_after_use
                .fetch_add(damaged_count, Ordering::Relaxed);
        }));
    }

    /// The read-only layers it was opened with ([`CacheOptions::layers`]).
    pub fn layers(&self) -> &[PathBuf] {
        &self.options.layers
    }

    /// What became of each read-only layer given in [`CacheOptions::layers`], in order.
    pub fn layer_outcomes(&self) -> &[LayerOutcome] {
        &self.layer_outcomes
    }

    /// What a user should hear, once, about layers that were not used: one line for each;
    /// None when every layer was used.
    pub fn layer_note(&self) -> Option<String> {
        let notes: Vec<String> = self
            .layer_outcomes
            .iter()
            .filter_map(LayerOutcome::note)
            .collect();
        (!notes.is_empty()).then(|| notes.join("\n"))
    }

    /// What the checks of this cache's file found, said as the faces say it (stderr, ExecuTorch's
    /// log): None if every entry checked was intact.
    pub fn damage_note(&self) -> Option<String> {
        let counters = &self.core().counters;
        let damaged = counters.corrupt_found.load(Ordering::Relaxed);
        if damaged == 0 {
            return None;
        }
        let after_use = counters.corrupt_after_use.load(Ordering::Relaxed);
        let not_remembered = counters.damage_not_remembered.load(Ordering::Relaxed);
        // What was found in read-only layers is said of each layer, the rest of this cache's
        // own file.
        let layer_damage = self.core().state.lock().layer_damage.clone();
        let in_layers: usize = layer_damage.iter().map(|d| d.entries).sum();
        let in_layers_after_use: usize = layer_damage
            .iter()
            .filter(|d| d.after_use)
            .map(|d| d.entries)
            .sum();
        let (damaged, after_use) = (
            damaged.saturating_sub(in_layers),
            after_use.saturating_sub(in_layers_after_use),
        );
        let path = self
            .path
            .as_ref()
            .map_or_else(|| "memory".to_string(), |p| p.display().to_string());
        let read_only = self.read_only.load(Ordering::Relaxed);
        let mut said = Vec::new();
        if after_use > 0 {
            said.push(format!(
                "{after_use} packed weights of {path} failed their checksum after this launch \
                 used them: its outputs may be wrong; {}",
                if not_remembered > 0 {
                    "the file cannot be written and this could not be remembered under the \
                     user's state directory"
                } else if read_only {
                    "the file cannot be written, so this is remembered under the user's state \
                     directory and every later launch repacks them"
                } else {
                    "the file was rewritten without them and the next launch repacks them"
                }
            ));
        }
        if damaged > after_use {
            said.push(format!(
                "{} packed weights of {path} failed their checksum before use and were repacked{}",
                damaged - after_use,
                if read_only {
                    " (the file cannot be written: as every launch will)"
                } else {
                    ""
                }
            ));
        }
        for d in &layer_damage {
            let layer = d.path.display();
            said.push(if d.after_use {
                format!(
                    "{} packed weights of read-only layer {layer} failed their checksum after \
                     this launch used them: its outputs may be wrong; {}",
                    d.entries,
                    if d.remembered {
                        "this is remembered under the user's state directory and later \
                         launches pack them into the writable cache"
                    } else {
                        "this could not be remembered under the user's state directory"
                    }
                )
            } else {
                format!(
                    "{} packed weights of read-only layer {layer} failed their checksum before \
                     use and are packed into the writable cache instead",
                    d.entries
                )
            });
        }
        (!said.is_empty()).then(|| said.join("; "))
    }

    /// Checks every packed weight of the file not checked yet against its checksum, now, and
    /// forgets the damaged ones (runtimes created after this pack them again); returns how many
    /// were damaged. What [`VerifyPacked::BeforeUse`] does at open, for a cache opened without it.
    pub fn verify_before_use(&self) -> usize {
        self.core().forget_corrupt(true)
    }

    /// How many of the cache's maps found their file cut short (see
    /// [`CacheError::Truncated`]) so far; 0, at the cost of one atomic load, in a process
    /// where no watched map ever faulted.
    pub fn lost_maps(&self) -> usize {
        self.core().lost_maps()
    }

    /// Fails with [`CacheError::Truncated`] if more of the cache's maps were found cut short
    /// than `lost_before` (what [`lost_maps`](Self::lost_maps) said before a runtime was
    /// created): that runtime may have read zeros for packed weights.
    pub fn check_maps(&self, lost_before: usize) -> Result<(), CacheError> {
        if self.lost_maps() > lost_before {
            // The file at fault: a read-only layer's, or the cache's own.
            let path = self
                .core()
                .last_lost_layer()
                .unwrap_or_else(|| self.path.clone().unwrap_or_default());
            return Err(CacheError::Truncated { path });
        }
        Ok(())
    }

    /// Waits for a background save to be durable on disk, and reports a failed save once
    /// (the one in progress, or an earlier one that made later `finalize` calls give up).
    pub fn wait_saved(&self) -> Result<(), CacheError> {
        let mut saver = self.saver.lock();
        if let Some(thread) = saver.thread.take() {
            saver.queue.lock().hurried = true;
            saver.hurry.notify_all();
            thread.join();
            saver.queue.lock().hurried = false;
        }
        let failed = saver.queue.lock().failed.take();
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// How many times this cache wrote its file (completed saves).
    pub fn saves(&self) -> usize {
        self.saves.load(Ordering::Relaxed)
    }

    /// How many weights this cache has packed so far: [`CacheStats::packed`], without the
    /// rest of a snapshot (which walks every entry).
    pub fn packed_count(&self) -> usize {
        self.core()
            .counters
            .reserve_space_calls
            .load(Ordering::Relaxed)
    }

    /// A snapshot of the counters and of what the cache holds now.
    pub fn stats(&self) -> CacheStats {
        let core = self.core();
        let state = core.state.lock();
        let c = &core.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            packed: c.reserve_space_calls.load(Ordering::Relaxed),
            unregistered: c.unregistered_packs.load(Ordering::Relaxed),
            deferred_fills: c.deferred_fills.load(Ordering::Relaxed),
            corrupt_found: c.corrupt_found.load(Ordering::Relaxed),
            checked: c.checked.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            key_mismatches: c.key_mismatches.load(Ordering::Relaxed),
            truncated: c.truncated.load(Ordering::Relaxed),
            wrong_size: c.wrong_size.load(Ordering::Relaxed),
            excess_permissions: self.excess_permissions.load(Ordering::Relaxed),
            entries: state.by_key.keys().filter(|k| !k.keeps_constant()).count(),
            packed_bytes: state
                .by_key
                .iter()
                .filter(|(k, _)| !k.keeps_constant())
                .map(|(_, i)| state.entries[i].size)
                .sum(),
            kept_constants: state.by_key.keys().filter(|k| k.keeps_constant()).count(),
            kept_served: c.kept_served.load(Ordering::Relaxed),
            unsaved: state.entries.iter().filter(|e| e.unsaved).count(),
            heap_entries: state
                .entries
                .iter()
                .filter(|e| matches!(e.location, Location::Heap(_)))
                .count(),
        }
    }

    /// The bytes of the constant `content` (`len` of them) if the cache keeps them, unpacked,
    /// in an entry of their own (see [`KEPT_CONSTANT_SEED`](super::format::KEPT_CONSTANT_SEED)): read from the cache's file rather
    /// than from the constant's source.
    pub(crate) fn kept_constant(&self, content: BlobId, len: usize) -> Option<DataBuffer> {
        self.core().kept_constant(content, len)
    }

    /// As [`kept_constant`](Self::kept_constant), checked against the entry's checksum first.
    pub(crate) fn kept_constant_checked(&self, content: BlobId, len: usize) -> Option<DataBuffer> {
        self.core().kept_constant_checked(content, len)
    }

    /// Keeps the constant `content`'s bytes in an entry of their own, saved with the packed
    /// weights, for later launches to read there (see [`kept_constant`](Self::kept_constant)).
    pub(crate) fn keep_constant(&self, content: BlobId, bytes: &[u8]) {
        self.core().keep_constant(content, bytes)
    }

    /// As [`keep_constant`](Self::keep_constant), copied by the next save rather than now:
    /// `data` is lent by `lender`, which has what no save copied yet copied before it ends
    /// ([`take_back_lent`](Self::take_back_lent)).
    pub(crate) fn lend_constant(&self, content: BlobId, data: DataBuffer, lender: u64) {
        self.core().lend_constant(content, data, lender)
    }

    /// Whether this cache writes a file of its own (it has one, not kept read-only): what it
    /// is lent to keep, a save copies ([`lend_constant`](Self::lend_constant)).
    pub(crate) fn saves_to_file(&self) -> bool {
        self.path.is_some() && !self.read_only.load(Ordering::Relaxed)
    }

    /// Copies the constants `lender` lent to be kept and that no save copied yet: it ends, and
    /// the buffers it lent with it.
    pub(crate) fn take_back_lent(&self, lender: u64) {
        self.core().take_back_lent(lender)
    }

    /// Checks every entry's packed bytes against its checksum (reads all of them: an explicit
    /// or background operation, never part of a launch).
    pub fn verify(&self) -> Vec<BadEntry> {
        let state = self.core().state.lock();
        let mut bad = Vec::new();
        for e in &state.entries {
            if let (Some(key), Some(sum)) = (e.key, e.checksum)
                && checksum64(state.bytes_of(e)) != sum
            {
                let offset = match e.location {
                    Location::Mapped { offset, .. } => offset as u64,
                    Location::Drafted(ref space) => space.file_offset(),
                    Location::Heap(_) => 0,
                };
                bad.push(BadEntry {
                    key,
                    offset,
                    size: e.size as u64,
                });
            }
        }
        bad
    }
}

impl Drop for PackedWeightsCache {
    fn drop(&mut self) {
        // A save in progress completes; whatever was packed after the last finalize is saved
        // now. A failure only costs a repack at the next launch.
        let _ = self.wait_saved();
        // A file used read-only is never written, not even at the end.
        let unsaved = self.core().has_unsaved() && !self.read_only.load(Ordering::Relaxed);
        if let (Some(path), true) = (&self.path, unsaved) {
            let _ = persist::save(
                self.core(),
                self.options.storage.get(),
                path,
                &self.compat,
                self.options.budget,
                self.file_mode(),
            );
        }
    }
}

/// The callbacks XNNPACK makes, callable from Rust too (benchmarks, custom integrations).
impl crate::xnn::PackedWeightsProvider for PackedWeightsCache {
    fn look_up(&self, key: &crate::xnn::LookUpKey) -> Option<usize> {
        self.core().look_up(key)
    }
    fn reserve_space(&self, n: usize) -> Option<std::ptr::NonNull<u8>> {
        self.core().reserve_space(n)
    }
    fn look_up_or_insert(
        &self,
        key: &crate::xnn::LookUpKey,
        ptr: Option<std::ptr::NonNull<u8>>,
        size: usize,
    ) -> Option<usize> {
        self.core().look_up_or_insert(key, ptr, size)
    }
    fn is_finalized(&self) -> bool {
        self.core().is_finalized()
    }
    fn offset_to_addr(&self, offset: usize) -> Option<std::ptr::NonNull<u8>> {
        self.core().offset_to_addr(offset)
    }
    fn reserves_zeroed(&self) -> bool {
        self.core().reserves_zeroed()
    }
}

// SAFETY: the provider struct lives in `xnn` (boxed, owned by self) for as long as self.
unsafe impl AsXnnWeightsCache for PackedWeightsCache {
    fn as_xnn_weights_cache(&self) -> xnnpack_sys::xnn_weights_cache_t {
        self.xnn.as_xnn_weights_cache()
    }
}

/// Checks a cache file (header, index, and with `check_data` every entry's checksum) against
/// what this process would accept; with `drop_bad`, rewrites it without the bad entries so the
/// next launch repacks them. The outer error is I/O; the inner one says why the whole file would
/// be rejected.
pub fn verify_file(
    path: &Path,
    options: &CacheOptions,
    check_data: bool,
    drop_bad: bool,
) -> Result<Result<FileReport, FileError>, CacheError> {
    persist::inspect_file(
        options.storage.get(),
        path,
        &options.compat(),
        check_data,
        drop_bad,
        options.budget,
        false,
    )
}

/// Rewrites a cache file with only its valid, checksum-clean entries, tightly packed, less what
/// `options.budget` evicts when the last save's entries are the live ones.
pub fn compact_file(
    path: &Path,
    options: &CacheOptions,
) -> Result<Result<FileReport, FileError>, CacheError> {
    persist::inspect_file(
        options.storage.get(),
        path,
        &options.compat(),
        true,
        true,
        options.budget,
        true,
    )
}
