//! Damage: checking packed bytes against their checksums, forgetting entries found damaged
//! (or remembered damaged, or whose file was cut short under their map), so no later look-up
//! finds them and no save copies them.

use super::{CacheCore, Entry, Location, Source};
use crate::cache::checksum::checksum64;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// An entry of a file that [`CacheCore::forget_corrupt`] has yet to check.
fn unchecked(e: &Entry, all: bool) -> bool {
    !e.checked
        && !e.layer
        && e.checksum.is_some()
        && (all || e.hit)
        && matches!(e.location, Location::Mapped { .. })
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
            let mut picked: Vec<usize> = (0..state.entries.len())
                .filter(|&i| pick(&state.entries[i]))
                .collect();
            // Each file front to back (a file's entries are held in key order).
            picked.sort_by_key(|&i| match state.entries[i].location {
                Location::Mapped { map, offset } => (map, offset),
                Location::Heap(_) | Location::Drafted(_) => (usize::MAX, i),
            });
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
            if let Some(key) = state.entries[i].key
                && state.by_key.get(&key) == Some(i)
            {
                state.by_key.remove(&key);
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
                    lost && e.key.is_some_and(|k| state.by_key.get(&k) == Some(i))
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
}
