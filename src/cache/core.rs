//! The provider XNNPACK calls: packed weights by content identity, from a mapped cache file or
//! from memory packed in this process.

use super::checksum::checksum64;
use super::draft::{DraftFile, Space};
use super::format::{EntryKey, FileEntry, KEPT_CONSTANT_SEED, REGION_ALIGNMENT};
use super::identity::BlobId;
use crate::aligned::AlignedBytes;
use crate::deferred::{DeferredData, Fill};
use crate::fast_hash::FastMap;
use crate::mmap::{FileIdentity, MappedFile};
use crate::named_data::{Backing, DataBuffer};
use crate::xnn::{LookUpKey, PackedWeightsProvider};
use parking_lot::Mutex;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Where an entry's packed bytes live.
pub(crate) enum Location {
    /// In `maps[map]` at `offset`.
    Mapped { map: usize, offset: usize },
    /// Packed in this process (shared with a save in progress).
    Heap(Arc<AlignedBytes>),
    /// Packed in this process straight into a cache file being made (see `draft.rs`), which a
    /// save may have published since.
    Drafted(Space),
}

/// Memory `reserve_space` handed to XNNPACK, until `look_up_or_insert` adopts it.
enum Reserved {
    Heap(AlignedBytes),
    Drafted(Space, usize),
}

/// How a file-backed cache starts a draft of its file when XNNPACK first packs.
pub(crate) struct DraftPlan {
    pub storage: crate::storage::SharedStorage,
    /// The cache file.
    pub destination: std::path::PathBuf,
    /// The permission bits to create it with, asked when it is created.
    pub mode: Box<dyn Fn() -> u32 + Send + Sync>,
    /// Packed bytes kept on the heap before the draft is started ([`HeapFirst`]).
    pub heap_first: usize,
}

pub(crate) struct Entry {
    /// None for weights whose unpacked pointers were not registered: usable by the runtime
    /// that packed them, never found by a look-up, never persisted.
    pub key: Option<EntryKey>,
    pub size: usize,
    pub location: Location,
    /// Known for entries read from or written to a file, and for those packed into a draft
    /// (summed as XNNPACK finished them: `Space::settle`).
    pub checksum: Option<u64>,
    /// Looked up (found) in this process.
    pub hit: bool,
    /// The order of its first look-up that found it in this process (runtime creation looks
    /// weights up in graph order): a save writes entries in this order, so that a first
    /// inference from a cold page cache reads the file front to back.
    pub first_hit: Option<u64>,
    /// For an entry packed here, the order of the look-up that missed it, on the same count:
    /// where a save puts it when no look-up found it since (a launch that repacked one weight
    /// keeps it in graph order). A later hit's order comes first: packing ahead looks weights
    /// up on several threads at once, the runtime's creation then finds them in graph order.
    pub first_miss: Option<u64>,
    /// Its packed bytes were checked against its checksum in this process.
    pub checked: bool,
    /// Packed in this process and not yet saved.
    pub unsaved: bool,
    /// Packed in this process (saved or not).
    pub packed_here: bool,
    /// The number of the last save that used it, as its file recorded (0 for an entry packed
    /// here: the next save gives it its own number).
    pub last_used: u64,
    /// Its address was handed to XNNPACK: the memory must not move or be freed.
    pub resolved: bool,
    /// It lies in a read-only layer (see `layers.rs`): never saved into the cache's own file,
    /// and checked, forgotten and remembered as its layer's.
    pub layer: bool,
}

struct Registered {
    /// The identities the address is registered under, each with its number of live
    /// registrations. One identity is the rule; two or more at once (a caller that registered
    /// the same bytes as two different tensors) make the address ambiguous: look-ups through it
    /// find nothing and what XNNPACK packs from it is never kept, so neither identity can be
    /// served the other's packing.
    ids: Vec<(BlobId, usize)>,
    /// Mapped data whose pages may be released once packed.
    release: Option<DataBuffer>,
    /// Other data XNNPACK reads only to pack this (a blockwise layer's scales): released with it.
    companions: Vec<DataBuffer>,
    /// Placeholders of other data XNNPACK reads only to pack this, with how to read each in:
    /// read in when a look-up of it misses, released once it is packed.
    companion_placeholders: Vec<(Arc<DeferredData>, Arc<Fill>)>,
    /// A placeholder: its bytes are read in (pinned) only when a look-up misses.
    deferred: Option<Arc<DeferredData>>,
    /// How to read them in, one per live registration (each from an init whose data source
    /// is alive while it is registered), by registration token.
    fills: Vec<(u64, Arc<Fill>)>,
}

impl Registered {
    /// The one identity of the address; None while it is ambiguous.
    fn id(&self) -> Option<BlobId> {
        match self.ids.as_slice() {
            [(id, _)] => Some(*id),
            _ => None,
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub maps: Vec<Arc<MappedFile>>,
    pub entries: Vec<Entry>,
    pub by_key: FastMap<EntryKey, usize>,
    /// Look-ups that found an entry for the first time, or missed a weight for the first time,
    /// so far: the next `first_hit` or `first_miss`.
    first_looks: u64,
    /// The `first_miss` of look-ups that missed, for the entry their packing inserts next.
    missed_at: FastMap<EntryKey, u64>,
    pending: FastMap<usize, Reserved>,
    /// Where packing goes for a file-backed cache that can be written; None packs on the heap.
    pub drafting: Option<DraftPlan>,
    /// The draft packing goes into now, until a save takes it.
    pub draft: Option<DraftFile>,
    /// Packed bytes put on the heap while no draft was started (see [`DraftPlan::heap_first`]).
    heap_first_packed: usize,
    registered: FastMap<usize, Registered>,
    /// Data files whose named keys were checked against their bytes, the most recently
    /// checked first: their keys are taken as content identities without hashing.
    pub sources: Vec<FileIdentity>,
    /// A source was checked since the last save.
    pub sources_unsaved: bool,
    /// Indices of `maps` whose file was cut short under them.
    pub lost: Vec<usize>,
    /// Draft windows (by address) whose published file was cut short under them.
    lost_windows: Vec<usize>,
    /// For a layer entry that took a key over from an entry of the cache's own file: that
    /// entry, by index.
    shadowed: FastMap<usize, usize>,
    /// Damage found in read-only layers, by layer: what the notes name instead of the cache's
    /// own file.
    pub layer_damage: Vec<LayerDamage>,
    /// The file of each layer's map, by index in `maps`: what a map cut short names.
    pub layer_files: FastMap<usize, std::path::PathBuf>,
}

/// Entries of one read-only layer found damaged (and forgotten).
#[derive(Debug, Clone)]
pub(crate) struct LayerDamage {
    /// The layer file.
    pub path: std::path::PathBuf,
    /// How many entries.
    pub entries: usize,
    /// Found by the check after the launch, so runtimes may have used them.
    pub after_use: bool,
    /// Remembered under the user's state directory (for damage found after use).
    pub remembered: bool,
}

/// An entry of a file that [`CacheCore::forget_corrupt`] has yet to check.
fn unchecked(e: &Entry, all: bool) -> bool {
    !e.checked
        && !e.layer
        && e.checksum.is_some()
        && (all || e.hit)
        && matches!(e.location, Location::Mapped { .. })
}

/// Packed bytes that stay valid without the state lock: a save reads them while XNNPACK goes on.
#[derive(Clone)]
pub(crate) enum Source {
    Mapped(Arc<MappedFile>, usize, usize),
    Heap(Arc<AlignedBytes>, usize),
    Drafted(Space, usize),
}

impl Source {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Source::Mapped(m, offset, size) => &m.bytes()[*offset..*offset + *size],
            Source::Heap(b, size) => &b[..*size],
            Source::Drafted(space, size) => space.bytes(*size),
        }
    }

    /// The draft space it lies in, if it does.
    pub fn space(&self) -> Option<&Space> {
        match self {
            Source::Drafted(space, _) => Some(space),
            _ => None,
        }
    }

    /// Lets go of the resident pages of a mapped source (they are read back from the page
    /// cache if touched again); heap bytes stay.
    pub fn release_pages(&self) {
        if let Source::Mapped(m, offset, size) = self {
            m.release_pages(*offset, *size);
        }
    }
}

impl State {
    /// The next first-look order number.
    fn next_first_look(&mut self) -> u64 {
        self.first_looks += 1;
        self.first_looks - 1
    }

    /// Whether a save has anything new to write.
    pub fn has_unsaved(&self) -> bool {
        self.sources_unsaved || self.entries.iter().any(|e| e.unsaved)
    }

    /// Records that `file`'s keys matched its bytes.
    pub fn add_source(&mut self, file: FileIdentity) {
        if self.sources.first() != Some(&file) {
            self.sources.retain(|s| *s != file);
            self.sources.insert(0, file);
            self.sources_unsaved = true;
        }
    }

    pub fn source_of(&self, e: &Entry) -> Source {
        match &e.location {
            Location::Mapped { map, offset } => {
                Source::Mapped(self.maps[*map].clone(), *offset, e.size)
            }
            Location::Heap(b) => Source::Heap(b.clone(), e.size),
            Location::Drafted(space) => Source::Drafted(space.clone(), e.size),
        }
    }

    pub fn bytes_of<'s>(&'s self, e: &'s Entry) -> &'s [u8] {
        match &e.location {
            Location::Mapped { map, offset } => &self.maps[*map].bytes()[*offset..*offset + e.size],
            Location::Heap(b) => &b[..e.size],
            Location::Drafted(space) => space.bytes(e.size),
        }
    }

    /// Room for `n` packed bytes in the draft of the cache file, started now if there is none;
    /// None where the cache does not draft, or the draft cannot grow (then the weight is packed
    /// on the heap, and saved as before). A draft that cannot be started is not tried again.
    fn reserve_in_draft(&mut self, n: usize) -> Option<Space> {
        let plan = self.drafting.as_ref()?;
        if self.draft.is_none() && self.heap_first_packed.saturating_add(n) <= plan.heap_first {
            self.heap_first_packed += n;
            return None;
        }
        if self.draft.is_none() {
            match DraftFile::create(plan.storage.clone(), &plan.destination, (plan.mode)()) {
                Ok(draft) => self.draft = Some(draft),
                Err(_) => {
                    self.drafting = None;
                    return None;
                }
            }
        }
        match self.draft.as_mut()?.reserve(n, REGION_ALIGNMENT as u64) {
            Ok(space) => Some(space),
            // A file system that cannot allocate ahead never will: pack on the heap from now on,
            // rather than asking again for every weight. (What was packed into the draft stays
            // readable through its windows, and the next save copies it.)
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.drafting = None;
                self.draft = None;
                None
            }
            // Out of space, say: this weight on the heap; the next may fit.
            Err(_) => None,
        }
    }

    /// Adds the entry `e` of the file `maps[map]`, unless its key is known already.
    pub fn insert_mapped(&mut self, map: usize, e: &FileEntry) {
        if self.by_key.contains_key(&e.key) {
            return;
        }
        self.push_mapped(map, e, false);
    }

    /// Adds the entry `e` of the read-only layer mapped as `maps[map]`: it serves its key ahead
    /// of the cache's own file (loaded before it), unless an earlier layer serves it already.
    pub fn insert_layer_entry(&mut self, map: usize, e: &FileEntry) {
        if let Some(&i) = self.by_key.get(&e.key) {
            if self.entries[i].layer {
                return;
            }
            // The cache's own entry serves again if this one is found damaged.
            self.shadowed.insert(self.entries.len(), i);
        }
        self.push_mapped(map, e, true);
    }

    /// The entry `e` of `maps[map]`, as found in its file, serving its key from now on.
    fn push_mapped(&mut self, map: usize, e: &FileEntry, layer: bool) {
        self.by_key.insert(e.key, self.entries.len());
        self.entries.push(Entry {
            key: Some(e.key),
            size: e.size as usize,
            location: Location::Mapped {
                map,
                offset: e.offset as usize,
            },
            checksum: Some(e.checksum),
            last_used: e.last_used,
            hit: false,
            first_hit: None,
            first_miss: None,
            checked: false,
            unsaved: false,
            packed_here: false,
            resolved: false,
            layer,
        });
    }

    /// Makes entry `i` (found damaged) serve no look-up: its key goes to the entry it shadowed,
    /// if any, else to none.
    fn forget_entry(&mut self, i: usize) {
        let Some(key) = self.entries[i].key else {
            return;
        };
        if self.by_key.get(&key) == Some(&i) {
            match self.shadowed.remove(&i) {
                Some(own) => self.by_key.insert(key, own),
                None => self.by_key.remove(&key),
            };
        }
    }

    /// The keys a read-only layer serves now (a damaged layer entry, forgotten, serves none).
    pub fn layer_served_keys(&self) -> std::collections::HashSet<EntryKey> {
        self.by_key
            .iter()
            .filter(|(_, &i)| self.entries[i].layer)
            .map(|(k, _)| *k)
            .collect()
    }
}

/// Counters; `reserve_space` calls are the number of weights XNNPACK packed.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicUsize,
    pub misses: AtomicUsize,
    pub reserve_space_calls: AtomicUsize,
    pub inserted: AtomicUsize,
    pub unregistered_packs: AtomicUsize,
    /// Placeholders read in because a look-up missed.
    pub deferred_fills: AtomicUsize,
    /// Entries of a file whose packed bytes no longer matched their checksum when checked.
    pub corrupt_found: AtomicUsize,
    /// Of those, the ones found after runtimes were handed them (the background check).
    pub corrupt_after_use: AtomicUsize,
    /// Of those, in a read-only cache file, the ones whose damage could not be remembered.
    pub damage_not_remembered: AtomicUsize,
    /// Entries of a file whose packed bytes were hashed to check them.
    pub checked: AtomicUsize,
    /// Entries saves left out to keep the file within its budget.
    pub evicted: AtomicUsize,
    /// Named keys that did not match their bytes.
    pub key_mismatches: AtomicUsize,
    /// Entries forgotten because their file was cut short under their map.
    pub truncated: AtomicUsize,
    /// Entries forgotten because a look-up's operator reads another size than they hold.
    pub wrong_size: AtomicUsize,
    /// Constants served from the entries that keep them (see [`KEPT_CONSTANT_SEED`]).
    pub kept_served: AtomicUsize,
}

#[derive(Default)]
pub(crate) struct CacheCore {
    pub state: Mutex<State>,
    pub finalized: AtomicBool,
    pub counters: Counters,
}

impl CacheCore {
    /// Whether entries of a file wait for [`forget_corrupt`](Self::forget_corrupt): found by a
    /// look-up (or, with `all`, any), not checked yet.
    pub fn has_unchecked(&self, all: bool) -> bool {
        let state = self.state.lock();
        state.entries.iter().any(|e| unchecked(e, all))
    }

    /// Checks the packed bytes of the file's entries that look-ups found in this process (with
    /// `all`, of every entry of the file) against their recorded checksums, without holding the
    /// lock while hashing. A mismatch is forgotten: a later look-up misses and repacks, and a
    /// save leaves it out of the file. Returns how many were forgotten.
    pub fn forget_corrupt(&self, all: bool) -> usize {
        self.forget_corrupt_at(all).len()
    }

    /// As [`forget_corrupt`](Self::forget_corrupt); returns where the forgotten entries lie in
    /// the file their map was made from (their offsets), for a record of them.
    pub fn forget_corrupt_at(&self, all: bool) -> Vec<u64> {
        self.forget_corrupt_where(|e| unchecked(e, all))
    }

    /// Checks the entries `pick` picks against their checksums, forgets the damaged ones (no
    /// later look-up finds them), and returns their offsets in their file.
    fn forget_corrupt_where(&self, pick: impl Fn(&Entry) -> bool) -> Vec<u64> {
        let to_check: Vec<(usize, Source, u64)> = {
            let mut state = self.state.lock();
            let picked: Vec<usize> = (0..state.entries.len())
                .filter(|&i| pick(&state.entries[i]))
                .collect();
            picked
                .into_iter()
                .filter_map(|i| {
                    state.entries[i].checked = true;
                    let e = &state.entries[i];
                    Some((i, state.source_of(e), e.checksum?))
                })
                .collect()
        };
        self.counters
            .checked
            .fetch_add(to_check.len(), Ordering::Relaxed);
        let bad: Vec<usize> = to_check
            .into_iter()
            .filter(|(_, source, sum)| checksum64(source.bytes()) != *sum)
            .map(|(i, _, _)| i)
            .collect();
        if bad.is_empty() {
            return Vec::new();
        }
        let mut state = self.state.lock();
        for &i in &bad {
            state.forget_entry(i);
        }
        self.counters
            .corrupt_found
            .fetch_add(bad.len(), Ordering::Relaxed);
        bad.iter()
            .filter_map(|&i| match state.entries[i].location {
                Location::Mapped { offset, .. } => Some(offset as u64),
                Location::Heap(_) | Location::Drafted(_) => None,
            })
            .collect()
    }

    /// As [`forget_corrupt_at`](Self::forget_corrupt_at), for every entry of the read-only
    /// layer mapped as `maps[map]` not checked yet.
    pub fn forget_corrupt_in_layer(&self, map: usize) -> Vec<u64> {
        self.forget_corrupt_where(|e| {
            e.layer
                && !e.checked
                && matches!(e.location, Location::Mapped { map: m, .. } if m == map)
        })
    }

    /// Marks every entry of the layer mapped as `maps[map]` checked (a record says it was, as
    /// it is now) and forgets those at `damaged` (offsets the record remembers), before any
    /// look-up finds them.
    pub fn settle_layer(&self, map: usize, damaged: &[u64]) -> usize {
        let mut state = self.state.lock();
        let mut forgotten = 0;
        for i in 0..state.entries.len() {
            let e = &state.entries[i];
            let Location::Mapped { map: m, offset } = e.location else {
                continue;
            };
            if !e.layer || m != map {
                continue;
            }
            state.entries[i].checked = true;
            if damaged.contains(&(offset as u64)) {
                state.forget_entry(i);
                forgotten += 1;
            }
        }
        self.counters
            .corrupt_found
            .fetch_add(forgotten, Ordering::Relaxed);
        forgotten
    }

    /// Marks every entry of a file checked: a record says its bytes were, as they are now.
    pub fn mark_checked(&self) {
        let mut state = self.state.lock();
        state
            .entries
            .iter_mut()
            .filter(|e| !e.layer)
            .for_each(|e| e.checked = true);
    }

    /// Forgets the entries of the first mapped file that lie at `offsets` (damage a record
    /// remembered from an earlier check), before any look-up finds them; returns how many.
    pub fn forget_at(&self, offsets: &[u64]) -> usize {
        let mut state = self.state.lock();
        let at: Vec<usize> = (0..state.entries.len())
            .filter(|&i| {
                !state.entries[i].layer
                    && matches!(state.entries[i].location,
                    Location::Mapped { map: 0, offset } if offsets.contains(&(offset as u64)))
            })
            .collect();
        for &i in &at {
            if let Some(key) = state.entries[i].key {
                if state.by_key.get(&key) == Some(&i) {
                    state.by_key.remove(&key);
                }
            }
            state.entries[i].checked = true;
        }
        self.counters
            .corrupt_found
            .fetch_add(at.len(), Ordering::Relaxed);
        at.len()
    }

    /// How many maps of this cache found their file cut short in place (reads past the new
    /// end give zeros), so far: runtimes handed packed weights from such a map compute garbage.
    /// A map seen lost for the first time has its entries forgotten, so runtimes created later
    /// repack them and saves never copy them. Without any fault in the process, one atomic load.
    pub fn lost_maps(&self) -> usize {
        if !crate::mmap::any_fault() {
            return 0;
        }
        let mut state = self.state.lock();
        let newly: Vec<usize> = (0..state.maps.len())
            .filter(|&m| state.maps[m].lost_pages() && !state.lost.contains(&m))
            .collect();
        let mut windows: Vec<usize> = state
            .entries
            .iter()
            .filter_map(|e| match &e.location {
                Location::Drafted(space) if space.window.lost_pages() => {
                    Some(Arc::as_ptr(&space.window) as usize)
                }
                _ => None,
            })
            .filter(|w| !state.lost_windows.contains(w))
            .collect();
        windows.sort_unstable();
        windows.dedup();
        if !newly.is_empty() || !windows.is_empty() {
            let forget: Vec<usize> = (0..state.entries.len())
                .filter(|&i| {
                    let e = &state.entries[i];
                    let lost = match &e.location {
                        Location::Mapped { map, .. } => newly.contains(map),
                        Location::Drafted(space) => {
                            windows.contains(&(Arc::as_ptr(&space.window) as usize))
                        }
                        Location::Heap(_) => false,
                    };
                    lost && e.key.is_some_and(|k| state.by_key.get(&k) == Some(&i))
                })
                .collect();
            for &i in &forget {
                if let Some(key) = state.entries[i].key {
                    state.by_key.remove(&key);
                }
            }
            self.counters
                .truncated
                .fetch_add(forget.len(), Ordering::Relaxed);
            state.lost.extend(newly);
            state.lost_windows.extend(windows);
        }
        state.lost.len() + state.lost_windows.len()
    }

    /// The layer file of the map found cut short last, if that map is a layer's (None for the
    /// cache's own file and its drafts).
    pub fn last_lost_layer(&self) -> Option<std::path::PathBuf> {
        let state = self.state.lock();
        let map = state.lost.last()?;
        state.layer_files.get(map).cloned()
    }

    /// Registers `ptr` under `id`. If it is registered under another identity already, it is
    /// ambiguous until one of them is unregistered (see [`Registered`]).
    pub fn register(&self, ptr: *const u8, id: BlobId, release: Option<DataBuffer>) {
        let mut state = self.state.lock();
        Self::add_registration(&mut state, ptr, id, release);
    }

    /// Registers `ptr` under `id` only if it is free or registered under `id` already; false
    /// (and nothing registered) if another identity holds it.
    pub fn try_register(&self, ptr: *const u8, id: BlobId, release: Option<DataBuffer>) -> bool {
        let mut state = self.state.lock();
        if let Some(r) = state.registered.get(&(ptr as usize)) {
            if r.ids.iter().any(|(other, _)| *other != id) {
                return false;
            }
        }
        Self::add_registration(&mut state, ptr, id, release);
        true
    }

    fn add_registration(
        state: &mut State,
        ptr: *const u8,
        id: BlobId,
        release: Option<DataBuffer>,
    ) {
        let r = state
            .registered
            .entry(ptr as usize)
            .or_insert_with(|| Registered {
                ids: Vec::new(),
                release: None,
                companions: Vec::new(),
                companion_placeholders: Vec::new(),
                deferred: None,
                fills: Vec::new(),
            });
        match r.ids.iter_mut().find(|(other, _)| *other == id) {
            Some((_, count)) => *count += 1,
            None => r.ids.push((id, 1)),
        }
        if release.is_some() {
            r.release = release;
        }
    }

    /// Registers a placeholder's address under `id`, with how to read its bytes in if a look-up
    /// misses; `token` names this registration's `fill` for [`unregister`](Self::unregister).
    /// False (and nothing registered) if another identity holds the address.
    pub fn register_deferred(
        &self,
        data: &Arc<DeferredData>,
        id: BlobId,
        fill: Arc<Fill>,
        token: u64,
    ) -> bool {
        let address = data.address();
        let mut state = self.state.lock();
        if let Some(r) = state.registered.get(&(address as usize)) {
            if r.ids.iter().any(|(other, _)| *other != id) {
                return false;
            }
        }
        Self::add_registration(&mut state, address, id, None);
        let r = state
            .registered
            .get_mut(&(address as usize))
            .expect("registered just now");
        r.deferred = Some(data.clone());
        r.fills.push((token, fill));
        true
    }

    /// The key of the entry that keeps the constant `content` (see [`KEPT_CONSTANT_SEED`]).
    fn kept_key(content: BlobId) -> EntryKey {
        EntryKey {
            kernel: BlobId::kept_constant(content),
            bias: BlobId::NONE,
            seed: KEPT_CONSTANT_SEED,
        }
    }

    /// The bytes of the constant `content`, `len` of them, if an entry keeps them (an entry of
    /// another size is forgotten, as a look-up forgets one): a view of the cache file's
    /// mapping, or of the heap entry a launch of this process kept.
    pub fn kept_constant(&self, content: BlobId, len: usize) -> Option<DataBuffer> {
        let mut state = self.state.lock();
        let i = *state.by_key.get(&Self::kept_key(content))?;
        let i = self.sized(&mut state, i, len)?;
        let (backing, offset): (Arc<dyn Backing>, usize) = match &state.entries[i].location {
            Location::Mapped { map, offset } => (state.maps[*map].clone(), *offset),
            Location::Heap(bytes) => (bytes.clone(), 0),
            Location::Drafted(_) => return None,
        };
        self.serve_kept(&mut state, i, backing, offset, len)
    }

    /// Entry `i`'s bytes at `offset` of `backing`, counted as used (so saved, checked, and
    /// placed in the file in the order of first use).
    fn serve_kept(
        &self,
        state: &mut State,
        i: usize,
        backing: Arc<dyn Backing>,
        offset: usize,
        len: usize,
    ) -> Option<DataBuffer> {
        let view = DataBuffer::new(backing, offset, len)?;
        let order = state.next_first_look();
        let e = &mut state.entries[i];
        e.hit = true;
        e.first_hit.get_or_insert(order);
        e.resolved = true;
        self.counters.kept_served.fetch_add(1, Ordering::Relaxed);
        Some(view)
    }

    /// Keeps the constant `content`'s bytes in an entry of their own (on the heap until a save
    /// writes them), unless one keeps them already.
    pub fn keep_constant(&self, content: BlobId, bytes: &[u8]) {
        let key = Self::kept_key(content);
        if self.state.lock().by_key.contains_key(&key) {
            return;
        }
        let Some(copy) = AlignedBytes::copy_from(bytes, REGION_ALIGNMENT) else {
            return;
        };
        let mut state = self.state.lock();
        if state.by_key.contains_key(&key) {
            return;
        }
        let order = state.next_first_look();
        let i = state.entries.len();
        state.entries.push(Entry {
            key: Some(key),
            size: bytes.len(),
            location: Location::Heap(Arc::new(copy)),
            checksum: None,
            last_used: 0,
            hit: false,
            first_hit: None,
            first_miss: Some(order),
            checked: false,
            unsaved: true,
            packed_here: true,
            resolved: false,
            layer: false,
        });
        state.by_key.insert(key, i);
    }

    /// Ends one registration of `ptr` under `id` (and, for a placeholder, its `token`'s fill).
    pub fn unregister(&self, ptr: *const u8, id: BlobId, token: Option<u64>) {
        let mut state = self.state.lock();
        if let Some(r) = state.registered.get_mut(&(ptr as usize)) {
            if let Some(token) = token {
                r.fills.retain(|(t, _)| *t != token);
            }
            if let Some(at) = r.ids.iter().position(|(other, _)| *other == id) {
                r.ids[at].1 -= 1;
                if r.ids[at].1 == 0 {
                    r.ids.remove(at);
                }
            }
            if r.ids.is_empty() {
                state.registered.remove(&(ptr as usize));
            }
        }
    }

    /// The identity `ptr` is registered under.
    pub fn registered_id(&self, ptr: *const u8) -> Option<BlobId> {
        self.state
            .lock()
            .registered
            .get(&(ptr as usize))
            .and_then(Registered::id)
    }

    /// Which of `kernels` (registered addresses) no entry is packed from yet, under any seed
    /// or bias: by index into `kernels`. An unregistered address counts as not packed.
    pub fn unpacked_kernels(&self, kernels: &[*const u8]) -> Vec<usize> {
        let state = self.state.lock();
        let packed: std::collections::HashSet<BlobId, foldhash::fast::RandomState> =
            state.by_key.keys().map(|k| k.kernel).collect();
        kernels
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                state
                    .registered
                    .get(&(**p as usize))
                    .and_then(Registered::id)
                    .is_none_or(|id| !packed.contains(&id))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Entry `i` if it holds the `size` bytes the operator looking it up will read, else the
    /// cache's own entry a layer entry `i` shadowed, if that one does. One that does not (a
    /// file whose index lies, or keys that were swapped) is forgotten: never found again, never
    /// saved, so the weight is repacked and the file repaired at the next save. Returning it
    /// would have XNNPACK read another weight's bytes, or past the mapping.
    fn sized(&self, state: &mut State, mut i: usize, size: usize) -> Option<usize> {
        loop {
            if state.entries[i].size == size {
                return Some(i);
            }
            self.counters.wrong_size.fetch_add(1, Ordering::Relaxed);
            // A layer entry of the wrong size gives its key back to the cache's own entry it
            // shadowed, which is asked in its turn: otherwise that entry, still in the file,
            // would be packed again at every launch and saved beside its key's new entry.
            let shadowed = state.shadowed.remove(&i);
            if let Some(key) = state.entries[i].key.take() {
                if state.by_key.get(&key) == Some(&i) {
                    match shadowed {
                        Some(own) => state.by_key.insert(key, own),
                        None => state.by_key.remove(&key),
                    };
                }
            }
            i = shadowed?;
        }
    }

    /// The content key of XNNPACK's pointer key; None if a non-null pointer is unknown.
    fn entry_key(state: &State, key: &LookUpKey) -> Option<EntryKey> {
        // A registered address whose identity is NONE stands for bytes no look-up may find
        // (see `register_constants`): read in on a miss, never identified.
        let id = |p: *const std::ffi::c_void| -> Option<BlobId> {
            if p.is_null() {
                Some(BlobId::NONE)
            } else {
                state
                    .registered
                    .get(&(p as usize))
                    .and_then(Registered::id)
                    .filter(|id| !id.is_none())
            }
        };
        let kernel = id(key.kernel)?;
        if kernel.is_none() {
            return None;
        }
        Some(EntryKey {
            kernel,
            bias: id(key.bias)?,
            seed: key.seed,
        })
    }

    /// The placeholders among a key's kernel and bias, and those of what XNNPACK reads to pack
    /// them ([`read_with`](Self::read_with)), each with the ways to read it in (one per live
    /// registration, newest first).
    fn deferred_of(state: &State, key: &LookUpKey) -> Vec<(Arc<DeferredData>, Vec<Arc<Fill>>)> {
        let registered: Vec<&Registered> = [key.kernel, key.bias]
            .into_iter()
            .filter_map(|p| state.registered.get(&(p as usize)))
            .collect();
        let own = registered.iter().filter_map(|r| {
            let d = r.deferred.clone()?;
            Some((d, r.fills.iter().rev().map(|(_, f)| f.clone()).collect()))
        });
        let companions = registered.iter().flat_map(|r| {
            r.companion_placeholders
                .iter()
                .map(|(d, f)| (d.clone(), vec![f.clone()]))
        });
        own.chain(companions).collect()
    }

    /// Reads `data` in with `fill` whenever what is registered at `ptr` is about to be packed (a
    /// look-up of it misses), and lets it go once packed: a placeholder of data XNNPACK reads
    /// only to pack it. False if nothing is registered there.
    pub fn read_with(&self, ptr: *const u8, data: Arc<DeferredData>, fill: Arc<Fill>) -> bool {
        let mut state = self.state.lock();
        match state.registered.get_mut(&(ptr as usize)) {
            Some(r) => {
                r.companion_placeholders.push((data, fill));
                true
            }
            None => false,
        }
    }

    fn release_unpacked(state: &State, key: &LookUpKey) {
        for p in [key.kernel, key.bias] {
            if let Some(r) = state.registered.get(&(p as usize)) {
                r.release
                    .iter()
                    .chain(&r.companions)
                    .for_each(DataBuffer::release_pages);
            }
        }
    }

    /// Releases `data`'s pages too whenever what is registered at `ptr` has been packed:
    /// data XNNPACK reads only while packing it. False if nothing is registered there.
    pub fn release_with(&self, ptr: *const u8, data: DataBuffer) -> bool {
        let mut state = self.state.lock();
        match state.registered.get_mut(&(ptr as usize)) {
            Some(r) => {
                r.companions.push(data);
                true
            }
            None => false,
        }
    }
}

impl PackedWeightsProvider for CacheCore {
    fn look_up(&self, key: &LookUpKey) -> Option<usize> {
        let mut state = self.state.lock();
        let found = CacheCore::entry_key(&state, key)
            .and_then(|k| state.by_key.get(&k).copied())
            .and_then(|i| self.sized(&mut state, i, key.packed_size));
        match found {
            Some(i) => {
                state.entries[i].hit = true;
                if state.entries[i].first_hit.is_none() {
                    state.entries[i].first_hit = Some(state.next_first_look());
                }
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                if let Some(k) = CacheCore::entry_key(&state, key) {
                    if !state.missed_at.contains_key(&k) {
                        let order = state.next_first_look();
                        state.missed_at.insert(k, order);
                    }
                }
                // XNNPACK packs next, reading the unpacked bytes: read in any placeholder's.
                let deferred = CacheCore::deferred_of(&state, key);
                drop(state);
                for (data, fills) in deferred {
                    // Any live registration's source will do: another init may end (and its
                    // source close) while this one reads. A failure of all is recorded in `data`:
                    // what is packed from it is never kept.
                    let fill = move |bytes: &mut [u8]| {
                        let mut last: Box<dyn std::error::Error + Send + Sync> =
                            "no data source is registered".into();
                        for f in &fills {
                            match f(bytes) {
                                Ok(()) => return Ok(()),
                                Err(e) => last = e,
                            }
                        }
                        Err(last)
                    };
                    let _ = data.pin(&fill);
                    self.counters.deferred_fills.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        found
    }

    fn reserve_space(&self, n: usize) -> Option<NonNull<u8>> {
        self.counters
            .reserve_space_calls
            .fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock();
        if let Some(space) = state.reserve_in_draft(n) {
            let ptr = NonNull::new(space.address())?;
            state
                .pending
                .insert(ptr.as_ptr() as usize, Reserved::Drafted(space, n));
            return Some(ptr);
        }
        drop(state);
        let block = AlignedBytes::zeroed(n, REGION_ALIGNMENT)?;
        let ptr = NonNull::new(block.as_ptr())?;
        self.state
            .lock()
            .pending
            .insert(ptr.as_ptr() as usize, Reserved::Heap(block));
        Some(ptr)
    }

    fn look_up_or_insert(
        &self,
        key: &LookUpKey,
        ptr: Option<NonNull<u8>>,
        size: usize,
    ) -> Option<usize> {
        let pending = ptr.and_then(|p| self.state.lock().pending.remove(&(p.as_ptr() as usize)));
        // Packed into the draft: summed now, outside the lock, while XNNPACK's writes are
        // fresh, so that no save reads the region again (see `Space::settle`).
        let drafted_sum = match &pending {
            Some(Reserved::Drafted(space, n)) if *n >= size => Some(space.settle(size)),
            _ => None,
        };
        let mut state = self.state.lock();
        let deferred = CacheCore::deferred_of(&state, key);
        // Packed from placeholders that could not be read in: usable by nobody but the runtime
        // being created (whose init then fails), never found, never saved.
        let poisoned = deferred.iter().any(|(d, _)| d.fill_failed());
        let content_key = CacheCore::entry_key(&state, key).filter(|_| !poisoned);
        if ptr.is_some() {
            // The packing that pinned them is over.
            deferred.iter().for_each(|(d, _)| d.unpin());
        }
        if let Some(&i) = content_key.as_ref().and_then(|k| state.by_key.get(k)) {
            // A hit confirmed (null ptr), or another thread packed the same weights first;
            // unless the entry is not the size this operator reads.
            if let Some(i) = self.sized(&mut state, i, size) {
                return Some(i);
            }
        }
        let ptr = ptr?;
        let location = match pending {
            Some(Reserved::Drafted(space, n)) if n >= size => Location::Drafted(space),
            Some(Reserved::Heap(block)) if block.len() >= size => Location::Heap(Arc::new(block)),
            _ => {
                // SAFETY: XNNPACK hands us `size` readable bytes of packed weights at `ptr`.
                let packed = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), size) };
                Location::Heap(Arc::new(AlignedBytes::copy_from(packed, REGION_ALIGNMENT)?))
            }
        };
        CacheCore::release_unpacked(&state, key);
        let first_miss = content_key.and_then(|k| state.missed_at.remove(&k));
        let i = state.entries.len();
        state.entries.push(Entry {
            key: content_key,
            size,
            location,
            checksum: drafted_sum,
            last_used: 0,
            hit: false,
            first_hit: None,
            first_miss,
            checked: false,
            unsaved: content_key.is_some(),
            packed_here: true,
            resolved: false,
            layer: false,
        });
        match content_key {
            Some(k) => {
                state.by_key.insert(k, i);
                self.counters.inserted.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.counters
                    .unregistered_packs
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(i)
    }

    fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    fn offset_to_addr(&self, offset: usize) -> Option<NonNull<u8>> {
        let mut state = self.state.lock();
        let ptr = {
            let e = state.entries.get(offset)?;
            state.bytes_of(e).as_ptr()
        };
        state.entries[offset].resolved = true;
        NonNull::new(ptr as *mut u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_constant_is_served_at_its_length_only_and_kept_once() {
        let core = CacheCore::default();
        let content = BlobId::of_bytes(b"scales");
        assert!(core.kept_constant(content, 6).is_none(), "nothing kept yet");
        core.keep_constant(content, b"scales");
        core.keep_constant(content, b"other!");
        let kept = core.kept_constant(content, 6).expect("kept");
        assert_eq!(kept.data(), b"scales", "the first bytes kept stay");
        assert_eq!(core.counters.kept_served.load(Ordering::Relaxed), 1);
        {
            let state = core.state.lock();
            assert_eq!(state.entries.len(), 1);
            let e = &state.entries[0];
            assert!(
                e.hit && e.unsaved && e.first_miss.is_some(),
                "saved, in first-use order"
            );
        }
        // Asked at another length (a crafted index), the entry is forgotten, never served short.
        assert!(core.kept_constant(content, 8).is_none());
        assert!(core.kept_constant(content, 6).is_none(), "forgotten");
        // No look-up of XNNPACK's finds it: its key is no packed weight's.
        let key = CacheCore::kept_key(content);
        assert_ne!(key.kernel, content);
        assert_eq!(key.bias, BlobId::NONE);
    }
}
