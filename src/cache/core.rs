//! The provider XNNPACK calls: packed weights by content identity, from a mapped cache file or
//! from memory packed in this process.

use super::format::{EntryKey, REGION_ALIGNMENT};
use super::identity::BlobId;
use crate::aligned::AlignedBytes;
use crate::fast_hash::FastMap;
use crate::mmap::MappedFile;
use crate::named_data::DataBuffer;
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
}

pub(crate) struct Entry {
    /// None for weights whose unpacked pointers were not registered: usable by the runtime
    /// that packed them, never found by a look-up, never persisted.
    pub key: Option<EntryKey>,
    pub size: usize,
    pub location: Location,
    /// Known for entries read from or written to a file.
    pub checksum: Option<u64>,
    /// Looked up (found) in this process.
    pub hit: bool,
    /// Packed in this process and not yet saved.
    pub unsaved: bool,
    /// Packed in this process (saved or not).
    pub packed_here: bool,
    /// Its address was handed to XNNPACK: the memory must not move or be freed.
    pub resolved: bool,
}

struct Registered {
    id: BlobId,
    count: usize,
    /// Mapped data whose pages may be released once packed.
    release: Option<DataBuffer>,
}

#[derive(Default)]
pub(crate) struct State {
    pub maps: Vec<Arc<MappedFile>>,
    pub entries: Vec<Entry>,
    pub by_key: FastMap<EntryKey, usize>,
    pending: FastMap<usize, AlignedBytes>,
    registered: FastMap<usize, Registered>,
}

/// Packed bytes that stay valid without the state lock: a save reads them while XNNPACK goes on.
#[derive(Clone)]
pub(crate) enum Source {
    Mapped(Arc<MappedFile>, usize, usize),
    Heap(Arc<AlignedBytes>, usize),
}

impl Source {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Source::Mapped(m, offset, size) => &m.bytes()[*offset..*offset + *size],
            Source::Heap(b, size) => &b[..*size],
        }
    }
}

impl State {
    pub fn source_of(&self, e: &Entry) -> Source {
        match &e.location {
            Location::Mapped { map, offset } => {
                Source::Mapped(self.maps[*map].clone(), *offset, e.size)
            }
            Location::Heap(b) => Source::Heap(b.clone(), e.size),
        }
    }

    pub fn bytes_of<'s>(&'s self, e: &'s Entry) -> &'s [u8] {
        match &e.location {
            Location::Mapped { map, offset } => &self.maps[*map].bytes()[*offset..*offset + e.size],
            Location::Heap(b) => &b[..e.size],
        }
    }

    pub fn insert_mapped(
        &mut self,
        key: EntryKey,
        map: usize,
        offset: usize,
        size: usize,
        checksum: u64,
    ) {
        if self.by_key.contains_key(&key) {
            return;
        }
        self.by_key.insert(key, self.entries.len());
        self.entries.push(Entry {
            key: Some(key),
            size,
            location: Location::Mapped { map, offset },
            checksum: Some(checksum),
            hit: false,
            unsaved: false,
            packed_here: false,
            resolved: false,
        });
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
}

#[derive(Default)]
pub(crate) struct CacheCore {
    pub state: Mutex<State>,
    pub finalized: AtomicBool,
    pub counters: Counters,
}

impl CacheCore {
    pub fn register(&self, ptr: *const u8, id: BlobId, release: Option<DataBuffer>) {
        let mut state = self.state.lock();
        let r = state.registered.entry(ptr as usize).or_insert(Registered {
            id,
            count: 0,
            release: None,
        });
        // A pointer registered again under another identity: the newer registration wins
        // (the bytes at one address are one blob while borrowed).
        r.id = id;
        r.count += 1;
        if release.is_some() {
            r.release = release;
        }
    }

    pub fn unregister(&self, ptr: *const u8) {
        let mut state = self.state.lock();
        if let Some(r) = state.registered.get_mut(&(ptr as usize)) {
            r.count -= 1;
            if r.count == 0 {
                state.registered.remove(&(ptr as usize));
            }
        }
    }

    /// The content key of XNNPACK's pointer key; None if a non-null pointer is unknown.
    fn entry_key(state: &State, key: &LookUpKey) -> Option<EntryKey> {
        let id = |p: *const std::ffi::c_void| -> Option<BlobId> {
            if p.is_null() {
                Some(BlobId::NONE)
            } else {
                state.registered.get(&(p as usize)).map(|r| r.id)
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

    fn release_unpacked(state: &State, key: &LookUpKey) {
        for p in [key.kernel, key.bias] {
            if let Some(buf) = state
                .registered
                .get(&(p as usize))
                .and_then(|r| r.release.as_ref())
            {
                buf.release_pages();
            }
        }
    }
}

impl PackedWeightsProvider for CacheCore {
    fn look_up(&self, key: &LookUpKey) -> Option<usize> {
        let mut state = self.state.lock();
        let found = CacheCore::entry_key(&state, key).and_then(|k| state.by_key.get(&k).copied());
        match found {
            Some(i) => {
                state.entries[i].hit = true;
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        found
    }

    fn reserve_space(&self, n: usize) -> Option<NonNull<u8>> {
        self.counters
            .reserve_space_calls
            .fetch_add(1, Ordering::Relaxed);
        let block = AlignedBytes::zeroed(n, REGION_ALIGNMENT)?;
        let ptr = NonNull::new(block.as_ptr())?;
        self.state
            .lock()
            .pending
            .insert(ptr.as_ptr() as usize, block);
        Some(ptr)
    }

    fn look_up_or_insert(
        &self,
        key: &LookUpKey,
        ptr: Option<NonNull<u8>>,
        size: usize,
    ) -> Option<usize> {
        let mut state = self.state.lock();
        let pending = ptr.and_then(|p| state.pending.remove(&(p.as_ptr() as usize)));
        let content_key = CacheCore::entry_key(&state, key);
        if let Some(&i) = content_key.as_ref().and_then(|k| state.by_key.get(k)) {
            // A hit confirmed (null ptr), or another thread packed the same weights first.
            return Some(i);
        }
        let ptr = ptr?;
        let block = match pending {
            Some(block) if block.len() >= size => block,
            _ => {
                // SAFETY: XNNPACK hands us `size` readable bytes of packed weights at `ptr`.
                let packed = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), size) };
                AlignedBytes::copy_from(packed, REGION_ALIGNMENT)?
            }
        };
        CacheCore::release_unpacked(&state, key);
        let i = state.entries.len();
        state.entries.push(Entry {
            key: content_key,
            size,
            location: Location::Heap(Arc::new(block)),
            checksum: None,
            hit: false,
            unsaved: content_key.is_some(),
            packed_here: true,
            resolved: false,
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
