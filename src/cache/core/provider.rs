//! The provider XNNPACK calls: look-ups, room for packing, and the packed weights it hands
//! back, kept as entries.

use super::staging::Staging;
use super::{CacheCore, Entry, Location, Reserved};
use crate::aligned::AlignedBytes;
use crate::cache::format::REGION_ALIGNMENT;
use crate::cache::packing_file::Space;
use crate::xnn::{LookUpKey, PackedWeightsProvider};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl PackedWeightsProvider for CacheCore {
    fn look_up(&self, key: &LookUpKey) -> Option<usize> {
        let mut state = self.state.lock();
        let found = CacheCore::entry_key(&state, key)
            .and_then(|k| state.by_key.get(&k))
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
                if let Some(k) = CacheCore::entry_key(&state, key)
                    && !state.missed_at.contains_key(&k)
                {
                    let order = state.next_first_look();
                    state.missed_at.insert(k, order);
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
        let drafted = {
            let mut state = self.state.lock();
            let space = state.reserve_in_draft(n);
            space.map(|space| (space, state.staging.take(n)))
        };
        if let Some((space, kept)) = drafted {
            // A region whose buffer cannot be had is left a hole; the weight goes on the heap.
            if let Some(buffer) = kept.or_else(|| AlignedBytes::zeroed(n, REGION_ALIGNMENT)) {
                let ptr = NonNull::new(buffer.as_ptr())?;
                let staged = Reserved::Staged { space, buffer, n };
                self.state
                    .lock()
                    .pending
                    .insert(ptr.as_ptr() as usize, staged);
                return Some(ptr);
            }
        }
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
        // Packed for the draft: written into it now, outside the lock (see `Space::fill`).
        let (pending, drafted_sum) = match pending {
            Some(Reserved::Staged { space, buffer, n }) if n >= size => {
                match space.fill(&buffer.as_slice()[..size]) {
                    Ok(sum) => {
                        if let Some(buffer) = Staging::cleared(buffer, n) {
                            self.state.lock().staging.keep(buffer);
                        }
                        (Some(Adopted::Drafted(space)), Some(sum))
                    }
                    // Kept on the heap, and saved from there, where the file could not take it.
                    Err(_) => (Some(Adopted::Heap(buffer)), None),
                }
            }
            // (XNNPACK never hands back more than it reserved: kept alive all the same.)
            Some(Reserved::Staged { buffer, .. }) | Some(Reserved::Heap(buffer)) => {
                (Some(Adopted::Heap(buffer)), None)
            }
            None => (None, None),
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
        if let Some(i) = content_key.as_ref().and_then(|k| state.by_key.get(k)) {
            // A hit confirmed (null ptr), or another thread packed the same weights first;
            // unless the entry is not the size this operator reads.
            if let Some(i) = self.sized(&mut state, i, size) {
                return Some(i);
            }
        }
        let ptr = ptr?;
        let location = match pending {
            Some(Adopted::Drafted(space)) => Location::Drafted(space),
            Some(Adopted::Heap(block)) if block.len() >= size => Location::Heap(Arc::new(block)),
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

    /// Reservations read as zeros: zeroed heap blocks, or staging buffers for the draft, fresh
    /// or zeroed again where they were handed out before (`Staging::cleared`).
    fn reserves_zeroed(&self) -> bool {
        true
    }
}

/// Where a weight XNNPACK finished packing lies, before it becomes an entry.
enum Adopted {
    /// Written into the draft's region.
    Drafted(Space),
    Heap(AlignedBytes),
}
