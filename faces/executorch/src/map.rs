//! ExecuTorch's `NamedDataMap`, seen as xnnblob's [`NamedDataMap`].

use crate::ffi::{EtBuffer, EtDataMap, EtError};
use cxx::UniquePtr;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use xnnblob::fast_hash::FastMap;
use xnnblob::named_data::{Backing, DataBuffer, NamedDataError, NamedDataMap, TensorLayout};

/// Constants read through ExecuTorch's maps in this process (each a `get_data`: a mapping of its
/// own under the mmap loader).
static READS: AtomicU64 = AtomicU64::new(0);

/// How many constants this process read through ExecuTorch's maps (for runners' reports).
pub(crate) fn reads() -> u64 {
    READS.load(Ordering::Relaxed)
}

/// A method's named-data map, valid while its init runs. Closing it at the end of init makes any
/// later use an error, never a use of a map ExecuTorch may have freed.
pub(crate) struct EtMap {
    map: Mutex<Option<UniquePtr<EtDataMap>>>,
    keys: Arc<MapKeys>,
    source: String,
}

/// The keys of one of ExecuTorch's maps, in its order, with an index by hash ("is it listed"
/// without a scan per constant). Keys end to end in one string, not one allocation each: a
/// decoder's 178 keys took 23 KB as strings in a hash set, 13 KB this way. The index holds
/// positions only; sorting them by key instead took more than half the cost of a 1,184-key
/// map's listing, and a binary search per constant as much again.
#[derive(Default)]
pub(crate) struct MapKeys {
    /// Every key, end to end, in the map's order.
    text: String,
    /// Where each key ends in `text`, in the map's order.
    ends: Vec<u32>,
    /// The position of the key of each hash (the first, where keys share one). 32 bits of
    /// it: half the table of whole hashes, and a key found by its hash is compared whole.
    by_hash: FastMap<u32, u32>,
    /// Positions of keys whose 32 bits of hash an earlier key has: about one in ten thousand
    /// maps of a thousand keys has one (the hasher's seed is the process's own), and a key
    /// listed twice.
    shared_hash: Vec<u32>,
}

impl MapKeys {
    /// Adds the next key in the map's order; None past 4 GiB of keys.
    fn push(&mut self, key: &str) -> Option<()> {
        let index = u32::try_from(self.ends.len()).ok()?;
        self.text.push_str(key);
        self.ends.push(u32::try_from(self.text.len()).ok()?);
        match self.by_hash.entry(self.hash(key)) {
            Entry::Vacant(v) => {
                v.insert(index);
            }
            Entry::Occupied(_) => self.shared_hash.push(index),
        }
        Some(())
    }

    fn hash(&self, key: &str) -> u32 {
        // The low half: foldhash mixes every bit of the key into it.
        self.by_hash.hasher().hash_one(key) as u32
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// The key at `index` in the map's order.
    fn get(&self, index: usize) -> Option<&str> {
        let end = *self.ends.get(index)? as usize;
        let start = index.checked_sub(1).map_or(0, |i| self.ends[i] as usize);
        Some(&self.text[start..end])
    }

    fn contains(&self, key: &str) -> bool {
        let is = |&i: &u32| self.get(i as usize) == Some(key);
        self.by_hash.get(&self.hash(key)).is_some_and(is) || self.shared_hash.iter().any(is)
    }
}

/// Key lists by the identity of ExecuTorch's map, so that the many delegates of one method
/// enumerate its keys once. An address names one map only while that map lives; a map outlives
/// the delegates made from it, and each delegate holds its map's list, so a list still alive
/// here belongs to a map still alive at that address.
static KEY_LISTS: Mutex<Option<HashMap<usize, Weak<MapKeys>>>> = Mutex::new(None);

fn keys_of(map: &EtDataMap, source: &str) -> Result<Arc<MapKeys>, NamedDataError> {
    let identity = map.identity();
    let mut lists = KEY_LISTS.lock();
    let lists = lists.get_or_insert_with(HashMap::new);
    if let Some(keys) = lists.get(&identity).and_then(Weak::upgrade) {
        return Ok(keys);
    }
    let failed = |e: cxx::Exception| NamedDataError::Backend {
        map: source.to_string(),
        message: format!("listing its keys: {}", e.what()),
    };
    // Views of the map's own keys first: their text is allocated once, at its size. Grown as
    // it was read, the pages of the smaller copies stayed in the heap (a decoder's warm load
    // held 24 KiB more).
    let in_order: Vec<&str> = (0..map.num_keys().map_err(failed)?)
        .map(|i| map.key_at(i).map_err(failed))
        .collect::<Result<_, _>>()?;
    let mut keys = MapKeys {
        text: String::with_capacity(in_order.iter().map(|k| k.len()).sum()),
        ends: Vec::with_capacity(in_order.len()),
        by_hash: FastMap::with_capacity_and_hasher(in_order.len(), Default::default()),
        shared_hash: Vec::new(),
    };
    for key in in_order {
        keys.push(key).ok_or_else(|| NamedDataError::Backend {
            map: source.to_string(),
            message: "listing its keys: more than 4 GiB of them".to_string(),
        })?;
    }
    let keys = Arc::new(keys);
    lists.retain(|_, list| list.strong_count() > 0);
    lists.insert(identity, Arc::downgrade(&keys));
    Ok(keys)
}

// SAFETY: ExecuTorch's NamedDataMap methods are const and its maps (FlatTensorDataMap, the
// program's own) read through data loaders that serve concurrent loads; every call here is
// serialised by the mutex besides.
unsafe impl Send for EtMap {}
// SAFETY: as above.
unsafe impl Sync for EtMap {}

impl EtMap {
    /// Wraps the map one init borrows, listing its keys (once per map); an error when
    /// ExecuTorch's map cannot list them.
    pub fn new(map: UniquePtr<EtDataMap>) -> Result<EtMap, NamedDataError> {
        // What this map lends is valid, and its keys meaningful, only within it: the address
        // of ExecuTorch's map names it for as long as the program that owns it lives (this
        // wrapper's own address would be reused by the next init).
        let source = format!(
            "executorch-named-data@{:#x}",
            map.as_ref().map_or(0, |m| m.identity())
        );
        let keys = match map.as_ref() {
            Some(m) => keys_of(m, &source)?,
            None => Arc::new(MapKeys::default()),
        };
        Ok(EtMap {
            map: Mutex::new(Some(map).filter(|m| !m.is_null())),
            keys,
            source,
        })
    }

    /// The map's key list, for a delegate made from it to hold (see [`KEY_LISTS`]).
    pub fn keys(&self) -> Arc<MapKeys> {
        self.keys.clone()
    }

    /// Ends the borrow: ExecuTorch may free the map once init returns.
    pub fn close(&self) {
        *self.map.lock() = None;
    }

    fn with<T>(
        &self,
        key: &str,
        call: impl FnOnce(&EtDataMap) -> Result<T, NamedDataError>,
    ) -> Result<T, NamedDataError> {
        let map = self.map.lock();
        match map.as_ref().and_then(|m| m.as_ref()) {
            Some(m) => call(m),
            None => Err(NamedDataError::Backend {
                map: self.source.clone(),
                message: format!("{key:?} asked for after the init that lent the map ended"),
            }),
        }
    }

    fn error(&self, key: &str, code: EtError, what: &str) -> NamedDataError {
        if code == EtError::NotFound {
            return NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.source.clone(),
            };
        }
        NamedDataError::Backend {
            map: self.source.clone(),
            message: format!(
                "{what}({key:?}) failed with ExecuTorch error {:#x}",
                code.repr
            ),
        }
    }

    /// `get_data(key)` of ExecuTorch's map: its buffer, or why not (ExecuTorch's error, or a
    /// C++ exception such as an allocation's).
    fn fetch(&self, m: &EtDataMap, key: &str) -> Result<UniquePtr<EtBuffer>, NamedDataError> {
        READS.fetch_add(1, Ordering::Relaxed);
        let mut code = EtError::Ok;
        let buffer = m
            .get_data(key, &mut code)
            .map_err(|e| NamedDataError::Backend {
                map: self.source.clone(),
                message: format!("get_data({key:?}): {}", e.what()),
            })?;
        if buffer.is_null() {
            return Err(self.error(key, code, "get_data"));
        }
        Ok(buffer)
    }
}

impl NamedDataMap for EtMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        self.with(key, |m| {
            let buffer = self.fetch(m, key)?;
            let lent = Arc::new(EtBytes(buffer));
            // No advice to read it ahead here: most reads read a blob at once, in order (a copy
            // into the cache file or a placeholder, a packing), which the kernel reads ahead by
            // itself; the constants XNNPACK reads at every launch are advised where they are
            // loaded (`DataBuffer::read_soon`).
            let len = lent.bytes().len();
            // Borrowed as ExecuTorch's own backend does: the buffer lives as long as the
            // program's delegates hold it, and is freed (ExecuTorch's `Free`) with the last.
            Ok(DataBuffer::new(lent, 0, len).expect("the whole buffer"))
        })
    }

    /// Unknown without reading: ExecuTorch's `get_tensor_layout` is not safe on the blobs its
    /// XNNPACK exporter writes (they carry no layout, and FlatTensorDataMap dereferences the
    /// missing one). The size of a constant left unread is checked when it is read in.
    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        if !self.keys.contains(key) {
            return Err(NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.source.clone(),
            });
        }
        Err(NamedDataError::Backend {
            map: self.source.clone(),
            message: format!("the size of {key:?} is not known without reading it"),
        })
    }

    fn tells_sizes(&self) -> bool {
        false
    }

    fn get_tensor_layout(&self, _key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        Ok(None)
    }

    /// Through `get_data` and a copy: ExecuTorch's `load_data_into` looks the blob's layout up
    /// too, and crashes on the layout-less blobs of its XNNPACK exports (as `get_tensor_layout`).
    fn load_data_into(&self, key: &str, buffer: &mut [u8]) -> Result<(), NamedDataError> {
        self.with(key, |m| {
            let data = self.fetch(m, key)?;
            let Some(b) = data.as_ref() else {
                return Err(self.error(key, EtError::Internal, "get_data"));
            };
            if b.size() != buffer.len() {
                return Err(NamedDataError::SizeMismatch {
                    key: key.to_string(),
                    data_size: b.size(),
                    buffer_size: buffer.len(),
                });
            }
            // SAFETY: ExecuTorch's FreeableBuffer holds `size` readable bytes at `data` until
            // it is freed, which dropping `data` (after the copy) does.
            buffer.copy_from_slice(unsafe { std::slice::from_raw_parts(b.data(), b.size()) });
            xnnblob::named_data::count_copy(buffer.len());
            Ok(())
        })
    }

    fn lists(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    fn num_keys(&self) -> usize {
        self.keys.len()
    }

    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        self.keys.get(index).ok_or(NamedDataError::IndexOutOfRange {
            index,
            len: self.keys.len(),
        })
    }

    fn name(&self) -> &str {
        &self.source
    }

    /// ExecuTorch's loaders own what `get_data` lends; they outlive the program's methods,
    /// not the program.
    fn buffers_live_with_program(&self) -> bool {
        true
    }
}

/// A buffer ExecuTorch lent (a delegate's processed payload, a named constant), owned by
/// xnnblob until the last view of it goes, which frees it (ExecuTorch's `Free`).
pub(crate) struct EtBytes(pub UniquePtr<EtBuffer>);

// SAFETY: a FreeableBuffer is plain memory with a free function; nothing in it is thread-bound.
unsafe impl Send for EtBytes {}
// SAFETY: only read after construction.
unsafe impl Sync for EtBytes {}

impl Backing for EtBytes {
    fn bytes(&self) -> &[u8] {
        match self.0.as_ref() {
            // SAFETY: `size` readable bytes at `data` until the buffer is freed (on drop).
            Some(b) if !b.data().is_null() => unsafe {
                std::slice::from_raw_parts(b.data(), b.size())
            },
            _ => &[],
        }
    }

    /// ExecuTorch sizes its buffers exactly (a read, or a map of the segment's pages): what is
    /// readable past the end is the rest of the last page.
    fn readable_after(&self) -> usize {
        let bytes = self.bytes();
        if bytes.is_empty() {
            return 0;
        }
        xnnblob::aligned::readable_in_page_after(bytes.as_ptr() as usize + bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::MapKeys;

    fn keys(list: &[&str]) -> MapKeys {
        let mut keys = MapKeys::default();
        for key in list {
            keys.push(key).expect("small");
        }
        keys
    }

    #[test]
    fn a_key_list_keeps_the_maps_order_and_finds_exactly_its_keys() {
        let k = keys(&["w2", "b", "", "w10", "a"]);
        assert_eq!(k.len(), 5);
        let in_order: Vec<&str> = (0..k.len()).map(|i| k.get(i).unwrap()).collect();
        assert_eq!(in_order, ["w2", "b", "", "w10", "a"]);
        assert_eq!(k.get(5), None);
        for key in ["w2", "b", "", "w10", "a"] {
            assert!(k.contains(key), "{key:?} is listed");
        }
        for key in ["w", "w1", "w20", "c", "A", "b "] {
            assert!(!k.contains(key), "{key:?} is not listed");
        }
    }

    #[test]
    fn a_key_listed_twice_is_found_and_keeps_both_places() {
        let k = keys(&["a", "b", "a"]);
        assert_eq!(k.len(), 3);
        assert_eq!([k.get(0), k.get(2)], [Some("a"), Some("a")]);
        assert_eq!(k.shared_hash, [2]);
        assert!(k.contains("a") && k.contains("b") && !k.contains("c"));
    }

    #[test]
    fn an_empty_key_list_lists_nothing() {
        let k = MapKeys::default();
        assert_eq!(k.len(), 0);
        assert_eq!(k.get(0), None);
        assert!(!k.contains(""));
        let k = keys(&[]);
        assert!(!k.contains("a"));
    }
}
