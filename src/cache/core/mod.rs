//! The cache's core: its entries (packed weights by content identity, from a mapped cache file or
//! from memory packed in this process), where their bytes lie, its counters, and the constants it
//! keeps. The provider XNNPACK calls is `provider.rs`, the registrations that translate its
//! pointer keys `registry.rs`, and the checks that forget damaged entries `damage.rs`.

mod damage;
mod key_index;
mod lent;
mod provider;
mod registry;
mod staging;

use super::checksum::checksum64;
use super::format::{
    EntryKey, FileEntry, KEPT_CONSTANT_BIAS, KEPT_CONSTANT_SEED, REGION_ALIGNMENT,
};
use super::identity::BlobId;
use super::packing_file::{DraftFile, Space};
use crate::aligned::AlignedBytes;
use crate::fast_hash::FastMap;
use crate::mmap::{FileIdentity, MappedFile};
use crate::named_data::{Backing, DataBuffer};
use key_index::KeyIndex;
use parking_lot::Mutex;
use registry::Registered;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Where an entry's packed bytes live.
pub(crate) enum Location {
    /// In `maps[map]` at `offset`.
    Mapped { map: usize, offset: usize },
    /// Packed in this process (shared with a save in progress).
    Heap(Arc<AlignedBytes>),
    /// Packed in this process straight into a cache file being made (see `packing_file.rs`), which a
    /// save may have published since.
    Drafted(Space),
}

/// Memory `reserve_space` handed to XNNPACK, until `look_up_or_insert` adopts it.
enum Reserved {
    Heap(AlignedBytes),
    /// A staging buffer (what XNNPACK writes), for the draft's region of the same size.
    Staged {
        space: Space,
        buffer: AlignedBytes,
        n: usize,
    },
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

#[derive(Default)]
pub(crate) struct State {
    pub maps: Vec<Arc<MappedFile>>,
    pub entries: Vec<Entry>,
    pub by_key: KeyIndex,
    /// Look-ups that found an entry for the first time, or missed a weight for the first time,
    /// so far: the next `first_hit` or `first_miss`.
    first_looks: u64,
    /// The `first_miss` of look-ups that missed, for the entry their packing inserts next.
    missed_at: FastMap<EntryKey, u64>,
    pending: FastMap<usize, Reserved>,
    /// Buffers drafted weights are packed into, kept for the next (see `staging.rs`).
    staging: staging::Staging,
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

    /// Adds an entry of this process that keeps a constant's bytes (`copy`, first read at
    /// `order`) under `key`, unless an entry holds the key already.
    fn insert_kept(&mut self, key: EntryKey, copy: AlignedBytes, order: u64) {
        if self.by_key.contains_key(&key) {
            return;
        }
        let i = self.entries.len();
        let size = copy.len();
        self.entries.push(Entry::kept(
            key,
            size,
            Location::Heap(Arc::new(copy)),
            order,
        ));
        self.by_key.insert(key, i);
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
        if let Some(i) = self.by_key.get(&e.key) {
            if self.entries[i].layer {
                return;
            }
            // The cache's own entry serves again if this one is found damaged.
            self.shadowed.insert(self.entries.len(), i);
        }
        self.push_mapped(map, e, true);
    }

    /// Adds the entries of the cache's own file, mapped as `maps[map]`, in its index's order:
    /// where nothing is indexed yet and the index is in key order (as this build writes it),
    /// their keys are searched in place, hashing none; otherwise each is added as
    /// [`insert_mapped`](Self::insert_mapped) adds it.
    pub fn insert_mapped_file(&mut self, map: usize, entries: &[FileEntry]) {
        let first = self.entries.len();
        if self
            .by_key
            .hold_file(entries.iter().map(|e| e.key).collect(), first)
        {
            self.entries
                .extend(entries.iter().map(|e| Entry::mapped(map, e, false)));
        } else {
            self.by_key.reserve(entries.len());
            for e in entries {
                self.insert_mapped(map, e);
            }
        }
    }

    /// The entry `e` of `maps[map]`, as found in its file, serving its key from now on.
    fn push_mapped(&mut self, map: usize, e: &FileEntry, layer: bool) {
        self.by_key.insert(e.key, self.entries.len());
        self.entries.push(Entry::mapped(map, e, layer));
    }

    /// Makes entry `i` (found damaged) serve no look-up: its key goes to the entry it shadowed,
    /// if any, else to none.
    fn forget_entry(&mut self, i: usize) {
        let Some(key) = self.entries[i].key else {
            return;
        };
        if self.by_key.get(&key) == Some(i) {
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
            .filter(|&(_, i)| self.entries[i].layer)
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
    /// Constants lent to be kept, not copied yet (see `lent.rs`).
    lent: Mutex<Vec<lent::Lent>>,
}

impl Entry {
    /// The entry `e` of the file mapped as `maps[map]`, as found there.
    fn mapped(map: usize, e: &FileEntry, layer: bool) -> Entry {
        Entry {
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
        }
    }

    /// A new entry of this process that keeps a constant (see [`KEPT_CONSTANT_SEED`]), first
    /// read at `order`.
    fn kept(key: EntryKey, size: usize, location: Location, order: u64) -> Entry {
        Entry {
            key: Some(key),
            size,
            location,
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
        }
    }
}

impl CacheCore {
    /// Whether a save has anything new to write: an entry, a checked data file, or a constant
    /// lent to be kept.
    pub fn has_unsaved(&self) -> bool {
        self.state.lock().has_unsaved() || self.has_lent()
    }

    /// Gives back the buffers kept for packing into the draft: a runtime's creation is over.
    pub fn release_staging(&self) {
        self.state.lock().staging.release();
    }

    /// The key of the entry that keeps the constant `content` (see [`KEPT_CONSTANT_SEED`]).
    fn kept_key(content: BlobId) -> EntryKey {
        EntryKey {
            kernel: content,
            bias: KEPT_CONSTANT_BIAS,
            seed: KEPT_CONSTANT_SEED,
        }
    }

    /// The bytes of the constant `content`, `len` of them, if an entry keeps them (an entry of
    /// another size is forgotten, as a look-up forgets one): a view of the cache file's
    /// mapping, or of the heap entry a launch of this process kept.
    pub fn kept_constant(&self, content: BlobId, len: usize) -> Option<DataBuffer> {
        self.kept(content, len, false)
    }

    /// As [`kept_constant`](Self::kept_constant), with the bytes checked against their
    /// checksum first (a damaged entry is forgotten, as a check after the launch forgets one):
    /// for a few bytes a launch acts on at once, where a check after it would come too late.
    pub fn kept_constant_checked(&self, content: BlobId, len: usize) -> Option<DataBuffer> {
        self.kept(content, len, true)
    }

    fn kept(&self, content: BlobId, len: usize, check: bool) -> Option<DataBuffer> {
        let mut state = self.state.lock();
        let i = state.by_key.get(&Self::kept_key(content))?;
        let i = self.sized(&mut state, i, len)?;
        if check
            && !state.entries[i].checked
            && let Some(sum) = state.entries[i].checksum
        {
            self.counters.checked.fetch_add(1, Ordering::Relaxed);
            if checksum64(state.bytes_of(&state.entries[i])) != sum {
                state.forget_entry(i);
                self.counters.corrupt_found.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            state.entries[i].checked = true;
        }
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
        // Each entry counts once, however many of a launch's delegates (or constants of one
        // delegate, under two keys) read it.
        if !std::mem::replace(&mut e.hit, true) {
            self.counters.kept_served.fetch_add(1, Ordering::Relaxed);
        }
        e.first_hit.get_or_insert(order);
        e.resolved = true;
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
        state.insert_kept(key, copy, order);
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
            if let Some(key) = state.entries[i].key.take()
                && state.by_key.get(&key) == Some(i)
            {
                match shadowed {
                    Some(own) => state.by_key.insert(key, own),
                    None => state.by_key.remove(&key),
                };
            }
            i = shadowed?;
        }
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
        core.kept_constant(content, 6).expect("served again");
        assert_eq!(
            core.counters.kept_served.load(Ordering::Relaxed),
            1,
            "an entry counts once"
        );
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
        assert!(key.keeps_constant());
        assert_ne!(key.bias, BlobId::NONE);
        assert_ne!(key.bias, BlobId::of_bytes(b"scales"));
    }
}
