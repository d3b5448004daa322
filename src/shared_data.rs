//! The backend-wide shared data cache: one copy of each named blob, however many models and
//! methods of a backend ask for it, loaded once even when they ask at the same time.
//!
//! Two modes, chosen per key by the first request:
//! - read-only ([`SharedDataCache::get_or_init`]): the entry holds the buffer `init` returns,
//!   typically a zero-copy view of a mapped file, which stays mapped while the entry lives;
//! - transformed ([`SharedDataCache::get_or_init_transformed`]): the entry holds an aligned,
//!   transformed copy, and the original is released at once so the file can be unmapped.

use crate::aligned::AlignedBytes;
use crate::named_data::{Backing, DataBuffer};
use parking_lot::{Condvar, Mutex};
use std::fmt;
use std::sync::{Arc, Weak};
use std::thread::{self, ThreadId};

/// Why an init failed: the init's own error, kept whole (shared, so that every caller that
/// waited for the init gets it). Two causes are equal when they read the same.
#[derive(Clone)]
pub struct InitCause(Arc<dyn std::error::Error + Send + Sync>);

impl InitCause {
    fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> InitCause {
        InitCause(Arc::from(error.into()))
    }

    /// The init's error, to downcast to its type.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for InitCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for InitCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl PartialEq for InitCause {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for InitCause {}

/// A stage of a transformed init that failed, and its error.
#[derive(Debug, thiserror::Error)]
#[error("{stage} failed")]
struct StageError {
    stage: &'static str,
    #[source]
    error: Box<dyn std::error::Error + Send + Sync>,
}

/// An error of [`SharedDataCache`]. Clone, so that one failed init can be handed to the
/// initialising caller and to every caller that waited for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedDataError {
    /// The init (or load, or transform) of `key` failed; nothing was cached.
    InitFailed {
        /// The named-data key whose init failed.
        key: String,
        /// The init's error, the same one for every caller that waited for it.
        cause: InitCause,
    },
    /// The init of `key` panicked; nothing was cached.
    InitPanicked {
        /// The named-data key whose init panicked.
        key: String,
    },
    /// An init asked for its own key (which would wait for itself forever).
    InitRecursion {
        /// The key the init was running for and asked for again.
        key: String,
    },
    /// `key` is shared read-only and was requested transformed, or the other way round.
    ModeMismatch {
        /// The key requested in the mode it is not held in.
        key: String,
    },
    /// `alignment` is not a power of two, or is above the alignment `key`'s shared copy was
    /// made with.
    BadAlignment {
        /// The key requested.
        key: String,
        /// The alignment requested, in bytes.
        alignment: usize,
    },
}

// Written by hand, not derived with `thiserror`: the source of `InitFailed` is the error inside
// its `InitCause`, which is not itself an error type for `#[source]` to point at.
impl fmt::Display for SharedDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedDataError::InitFailed { key, .. } => {
                write!(f, "shared data {key:?}: init failed")
            }
            SharedDataError::InitPanicked { key } => {
                write!(f, "shared data {key:?}: init panicked")
            }
            SharedDataError::InitRecursion { key } => {
                write!(f, "shared data {key:?}: init requested its own key")
            }
            SharedDataError::ModeMismatch { key } => write!(
                f,
                "shared data {key:?} is held in the other mode (read-only vs transformed)"
            ),
            SharedDataError::BadAlignment { key, alignment } => write!(
                f,
                "shared data {key:?}: alignment {alignment} is not a power of two, or is above \
                 the alignment the shared copy was made with"
            ),
        }
    }
}

impl std::error::Error for SharedDataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedDataError::InitFailed { cause, .. } => Some(cause.error()),
            _ => None,
        }
    }
}

/// Counters of a [`SharedDataCache`], read together under its lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedDataStats {
    /// Calls served by a live entry or by joining an init in flight (a call that joined an
    /// init counts even if that init then failed).
    pub hits: usize,
    /// Init runs that succeeded.
    pub inits: usize,
    /// Init runs that failed or panicked.
    pub failures: usize,
    /// Live entries.
    pub entries: usize,
    /// Sum of the sizes of the live entries' buffers.
    pub bytes_held: usize,
}

/// How a key's entry was made; a key is only ever shared in the mode it was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    ReadOnly,
    Transformed { alignment: usize },
}

impl Mode {
    /// Whether an entry made in `self` can serve a request in `requested`. A transformed copy
    /// aligned to A serves any alignment up to A (both are powers of two).
    fn serves(self, requested: Mode, key: &str) -> Result<(), SharedDataError> {
        match (self, requested) {
            (Mode::ReadOnly, Mode::ReadOnly) => Ok(()),
            (Mode::Transformed { alignment: made }, Mode::Transformed { alignment })
                if alignment <= made =>
            {
                Ok(())
            }
            (Mode::Transformed { .. }, Mode::Transformed { alignment }) => {
                Err(SharedDataError::BadAlignment {
                    key: key.to_string(),
                    alignment,
                })
            }
            _ => Err(SharedDataError::ModeMismatch {
                key: key.to_string(),
            }),
        }
    }
}

/// One init in flight: its callers wait here for the outcome, which stays readable for every
/// waiter however late it wakes, so no wakeup is lost.
struct Pending {
    owner: ThreadId,
    outcome: Mutex<Option<Result<SharedData, SharedDataError>>>,
    done: Condvar,
}

impl Pending {
    fn publish(&self, outcome: Result<SharedData, SharedDataError>) {
        *self.outcome.lock() = Some(outcome);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<SharedData, SharedDataError> {
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(result) = outcome.as_ref() {
                return result.clone();
            }
            self.done.wait(&mut outcome);
        }
    }
}

enum Slot {
    InFlight {
        mode: Mode,
        id: u64,
        pending: Arc<Pending>,
    },
    /// Only a Weak: the handles own the entry, the cache just finds it.
    Ready {
        mode: Mode,
        id: u64,
        entry: Weak<Entry>,
    },
}

#[derive(Default)]
struct State {
    /// By key; a key's one allocation is shared by its slot, its init and its entry.
    slots: crate::fast_hash::FastMap<Arc<str>, Slot>,
    next_id: u64,
    stats: SharedDataStats,
}

/// The shared buffer of one key. Dropped with its last [`SharedData`]; it then takes itself
/// out of the cache.
struct Entry {
    key: Arc<str>,
    id: u64,
    buffer: DataBuffer,
    cache: Weak<Mutex<State>>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let Some(cache) = self.cache.upgrade() else {
            return;
        };
        let mut state = cache.lock();
        state.stats.entries -= 1;
        state.stats.bytes_held -= self.buffer.len();
        // The slot may already belong to a newer init that found this entry dead.
        let ours = matches!(
            state.slots.get(&self.key),
            Some(Slot::Ready { id, .. }) if *id == self.id
        );
        let removed = if ours {
            state.slots.remove(&self.key)
        } else {
            None
        };
        drop(state);
        drop(removed);
    }
}

/// A reference-counted handle to one shared entry; cloning it adds a reference. The bytes are
/// the entry's own (no copy), valid for as long as the handle lives.
#[derive(Clone)]
pub struct SharedData {
    entry: Arc<Entry>,
}

impl SharedData {
    /// The entry's bytes, shared by every handle (no copy).
    pub fn data(&self) -> &[u8] {
        self.entry.buffer.data()
    }

    /// The buffer the entry holds (a view of the original in read-only mode, the aligned copy
    /// in transformed mode).
    pub fn buffer(&self) -> &DataBuffer {
        &self.entry.buffer
    }

    /// The named-data key this entry is shared under.
    pub fn key(&self) -> &str {
        &self.entry.key
    }
}

impl std::ops::Deref for SharedData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data()
    }
}

impl AsRef<[u8]> for SharedData {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

impl fmt::Debug for SharedData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedData")
            .field("key", &self.key())
            .field("len", &self.data().len())
            .finish()
    }
}

/// One entry per key across all models and methods of a backend.
///
/// Release policy: an entry lives as long as at least one [`SharedData`] handle to it exists.
/// The cache itself keeps only a weak reference, so when the last handle drops the entry is
/// removed from the cache and its buffer released (in read-only mode, that may unmap the
/// file). A later request for the key runs its init again. Handles may outlive the cache.
///
/// Each key's init runs once however many callers race for it; the others wait and share its
/// result, or its error. Failures are not cached: the next request runs init again. Init runs
/// without the cache's lock held, so it may use the cache for other keys, but not for its own
/// key (reported as [`SharedDataError::InitRecursion`] instead of deadlocking) nor in a cycle
/// through other keys' inits (not detected). Every
/// caller of a key must produce the same data: whichever init runs first is what all share.
pub struct SharedDataCache {
    state: Arc<Mutex<State>>,
}

impl Default for SharedDataCache {
    fn default() -> Self {
        SharedDataCache::new()
    }
}

impl fmt::Debug for SharedDataCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedDataCache")
            .field("stats", &self.stats())
            .finish()
    }
}

/// What a request does, decided under the lock and carried out after it is released.
enum Step {
    Hit(Arc<Entry>),
    Wait(Arc<Pending>),
    Init(InitGuard),
}

/// The running init of one key. Whatever way the init ends, including a panic unwinding
/// through it, the slot is settled and the waiters are woken.
struct InitGuard {
    state: Arc<Mutex<State>>,
    key: Arc<str>,
    mode: Mode,
    id: u64,
    pending: Arc<Pending>,
    settled: bool,
}

impl InitGuard {
    fn succeed(mut self, buffer: DataBuffer) -> SharedData {
        self.settled = true;
        let len = buffer.len();
        let entry = Arc::new(Entry {
            key: self.key.clone(),
            id: self.id,
            buffer,
            cache: Arc::downgrade(&self.state),
        });
        let mut state = self.state.lock();
        state.stats.inits += 1;
        state.stats.entries += 1;
        state.stats.bytes_held += len;
        let in_flight = state.slots.insert(
            self.key.clone(),
            Slot::Ready {
                mode: self.mode,
                id: self.id,
                entry: Arc::downgrade(&entry),
            },
        );
        drop(state);
        let shared = SharedData { entry };
        self.pending.publish(Ok(shared.clone()));
        drop(in_flight);
        shared
    }

    fn fail(mut self, cause: InitCause) -> SharedDataError {
        self.settled = true;
        self.settle_failed(SharedDataError::InitFailed {
            key: self.key.to_string(),
            cause,
        })
    }

    fn settle_failed(&self, error: SharedDataError) -> SharedDataError {
        let mut state = self.state.lock();
        state.stats.failures += 1;
        let ours = matches!(
            state.slots.get(&self.key),
            Some(Slot::InFlight { id, .. }) if *id == self.id
        );
        let removed = if ours {
            state.slots.remove(&self.key)
        } else {
            None
        };
        drop(state);
        self.pending.publish(Err(error.clone()));
        drop(removed);
        error
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        if !self.settled {
            self.settle_failed(SharedDataError::InitPanicked {
                key: self.key.to_string(),
            });
        }
    }
}

impl SharedDataCache {
    /// An empty cache.
    pub fn new() -> SharedDataCache {
        SharedDataCache {
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// Read-only mode: the shared buffer of `key`, made by `init` (typically
    /// `|| map.get_data(key)`) if no live entry has it. `init` runs once however many callers
    /// race; they wait and share its result, or its error.
    pub fn get_or_init<E>(
        &self,
        key: &str,
        init: impl FnOnce() -> Result<DataBuffer, E>,
    ) -> Result<SharedData, SharedDataError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.get_or_run(key, Mode::ReadOnly, || init().map_err(InitCause::new))
    }

    /// Transformed mode: the shared buffer of `key`, made by loading the original with `load`,
    /// transforming it into a copy aligned to `alignment` (a power of two), then releasing the
    /// original at once, so that a file nothing else maps is unmapped. Runs once per key like
    /// [`get_or_init`](Self::get_or_init).
    pub fn get_or_init_transformed<E>(
        &self,
        key: &str,
        load: impl FnOnce() -> Result<DataBuffer, E>,
        transform: impl FnOnce(&[u8]) -> Result<Vec<u8>, E>,
        alignment: usize,
    ) -> Result<SharedData, SharedDataError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let stage = |stage: &'static str| {
            move |error: E| {
                InitCause::new(StageError {
                    stage,
                    error: error.into(),
                })
            }
        };
        if !alignment.is_power_of_two() {
            return Err(SharedDataError::BadAlignment {
                key: key.to_string(),
                alignment,
            });
        }
        self.get_or_run(key, Mode::Transformed { alignment }, || {
            let mut original = load().map_err(stage("load"))?;
            let transformed = transform(original.data()).map_err(stage("transform"))?;
            original.free();
            drop(original);
            let aligned = AlignedBytes::copy_from(&transformed, alignment).ok_or_else(|| {
                InitCause::new(format!("out of memory for {} bytes", transformed.len()))
            })?;
            drop(transformed);
            let len = aligned.len();
            let backing: Arc<dyn Backing> = Arc::new(aligned);
            DataBuffer::new(backing, 0, len)
                .ok_or_else(|| InitCause::new("the aligned copy is smaller than its length"))
        })
    }

    /// Serves `key` from a live entry, by waiting for its init in flight, or by running `run`.
    /// Nothing that can drop an entry happens under the lock: an entry's drop takes the lock.
    fn get_or_run(
        &self,
        key: &str,
        mode: Mode,
        run: impl FnOnce() -> Result<DataBuffer, InitCause>,
    ) -> Result<SharedData, SharedDataError> {
        let mut state = self.state.lock();
        let step = match state.slots.get(key) {
            Some(Slot::Ready {
                mode: made, entry, ..
            }) if entry.strong_count() > 0 => {
                made.serves(mode, key)?;
                entry.upgrade().map(Step::Hit)
            }
            Some(Slot::InFlight {
                mode: made,
                pending,
                ..
            }) => {
                made.serves(mode, key)?;
                if pending.owner == thread::current().id() {
                    return Err(SharedDataError::InitRecursion {
                        key: key.to_string(),
                    });
                }
                Some(Step::Wait(pending.clone()))
            }
            // Absent, or a dead entry whose drop has not yet taken it out.
            _ => None,
        };
        let step = match step {
            Some(step) => {
                state.stats.hits += 1;
                step
            }
            None => {
                let id = state.next_id;
                state.next_id += 1;
                let pending = Arc::new(Pending {
                    owner: thread::current().id(),
                    outcome: Mutex::new(None),
                    done: Condvar::new(),
                });
                let key: Arc<str> = Arc::from(key);
                let stale = state.slots.insert(
                    key.clone(),
                    Slot::InFlight {
                        mode,
                        id,
                        pending: pending.clone(),
                    },
                );
                // A dead entry's slot holds only a Weak; dropping it drops no entry.
                drop(stale);
                Step::Init(InitGuard {
                    state: self.state.clone(),
                    key,
                    mode,
                    id,
                    pending,
                    settled: false,
                })
            }
        };
        drop(state);
        match step {
            Step::Hit(entry) => Ok(SharedData { entry }),
            Step::Wait(pending) => pending.wait(),
            Step::Init(guard) => match run() {
                Ok(buffer) => Ok(guard.succeed(buffer)),
                Err(cause) => Err(guard.fail(cause)),
            },
        }
    }

    /// A snapshot of the cache's counters, all read at one instant.
    pub fn stats(&self) -> SharedDataStats {
        self.state.lock().stats
    }

    /// The number of live entries.
    pub fn len(&self) -> usize {
        self.state.lock().stats.entries
    }

    /// Whether the cache holds no live entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` has a live entry (an init in flight does not count).
    pub fn contains(&self, key: &str) -> bool {
        matches!(
            self.state.lock().slots.get(key),
            Some(Slot::Ready { entry, .. }) if entry.strong_count() > 0
        )
    }
}
