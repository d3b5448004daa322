//! A packed-weights provider that keeps everything in process memory.
//!
//! It is what XNNPACK's own cache should have been for a single process: `look_up` really hits,
//! so a second runtime over the same weights packs nothing. It is also the "floor" the persistent
//! cache is measured against: no cache can be faster than one that already holds every weight.

use super::weights_provider::{LookUpKey, PackedWeightsProvider};
use crate::aligned::AlignedBytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Alignment of every packed region; XNNPACK needs 64 at most on x86 and Arm.
const ALIGN: usize = 64;

#[derive(Default)]
struct State {
    /// Reserved but not yet inserted, by address.
    pending: HashMap<usize, AlignedBytes>,
    /// Inserted blocks by offset.
    entries: HashMap<usize, (AlignedBytes, usize)>,
    by_key: HashMap<(u32, usize, usize), usize>,
    next_offset: usize,
}

/// Counters of what XNNPACK asked for; they tell whether a runtime packed anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProviderStats {
    /// `look_up` calls that found packed weights.
    pub look_up_hits: usize,
    /// `look_up` calls that found nothing (XNNPACK packs next).
    pub look_up_misses: usize,
    /// `reserve_space` calls: one per weight XNNPACK set out to pack (0: nothing was packed).
    pub reserve_space_calls: usize,
    /// `look_up_or_insert` calls, including the null-pointer look-ups of XNNPACK's convolution
    /// path.
    pub look_up_or_insert_calls: usize,
    /// Packed weights the cache holds.
    pub entries: usize,
    /// Total size in bytes of the packed weights held (without alignment padding).
    pub packed_bytes: usize,
}

/// An in-memory packed-weights provider keyed by XNNPACK's (seed, kernel address, bias address).
#[derive(Default)]
pub struct InMemoryProvider {
    state: Mutex<State>,
    finalized: AtomicBool,
    look_up_hits: AtomicUsize,
    look_up_misses: AtomicUsize,
    reserve_space_calls: AtomicUsize,
    look_up_or_insert_calls: AtomicUsize,
}

impl InMemoryProvider {
    /// An empty cache, not finalized: XNNPACK can pack into it.
    pub fn new() -> InMemoryProvider {
        InMemoryProvider::default()
    }

    /// Lets runtimes be set up against the cache; from now on nothing new can be packed into it.
    pub fn finalize(&self) {
        self.finalized.store(true, Ordering::Release);
    }

    /// The calls counted so far, and what the cache holds now.
    pub fn stats(&self) -> ProviderStats {
        let state = self.state.lock();
        ProviderStats {
            look_up_hits: self.look_up_hits.load(Ordering::Relaxed),
            look_up_misses: self.look_up_misses.load(Ordering::Relaxed),
            reserve_space_calls: self.reserve_space_calls.load(Ordering::Relaxed),
            look_up_or_insert_calls: self.look_up_or_insert_calls.load(Ordering::Relaxed),
            entries: state.entries.len(),
            packed_bytes: state.entries.values().map(|(_, size)| size).sum(),
        }
    }
}

fn key_tuple(key: &LookUpKey) -> (u32, usize, usize) {
    (key.seed, key.kernel as usize, key.bias as usize)
}

impl PackedWeightsProvider for InMemoryProvider {
    fn look_up(&self, key: &LookUpKey) -> Option<usize> {
        let found = self.state.lock().by_key.get(&key_tuple(key)).copied();
        let counter = if found.is_some() {
            &self.look_up_hits
        } else {
            &self.look_up_misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    fn reserve_space(&self, n: usize) -> Option<NonNull<u8>> {
        self.reserve_space_calls.fetch_add(1, Ordering::Relaxed);
        if self.finalized.load(Ordering::Acquire) {
            return None;
        }
        let block = AlignedBytes::zeroed(n, ALIGN)?;
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
        self.look_up_or_insert_calls.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock();
        let pending = ptr.and_then(|p| state.pending.remove(&(p.as_ptr() as usize)));
        if let Some(&offset) = state.by_key.get(&key_tuple(key)) {
            return Some(offset); // the duplicate reservation, if any, is dropped here
        }
        let ptr = ptr?;
        let block = match pending {
            Some(block) if block.len() >= size => block,
            // Not memory we reserved: adopt a copy.
            _ => {
                // SAFETY: XNNPACK passes `size` readable bytes of packed weights at `ptr`.
                let packed = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), size) };
                AlignedBytes::copy_from(packed, ALIGN)?
            }
        };
        let offset = state.next_offset;
        state.next_offset = offset.checked_add(size.max(1).next_multiple_of(ALIGN))?;
        state.entries.insert(offset, (block, size));
        state.by_key.insert(key_tuple(key), offset);
        Some(offset)
    }

    fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    fn offset_to_addr(&self, offset: usize) -> Option<NonNull<u8>> {
        self.state
            .lock()
            .entries
            .get(&offset)
            .and_then(|(block, _)| NonNull::new(block.as_ptr()))
    }

    /// Each reservation is a zeroed block of its own.
    fn reserves_zeroed(&self) -> bool {
        true
    }
}
