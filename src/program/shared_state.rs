//! The state a program's methods share: ExecuTorch's memory id 2, where
//! `MemoryPlanningPass(share_mutable_buffers=True)` plans every mutable buffer, at the same
//! offset in every method. ExecuTorch's `Module` shares it between methods only when made with
//! `share_memory_arenas`; without that, a method that reads what another wrote (an encoder's
//! cross-attention cache, a prefill's KV cache) silently sees zeros. Here the methods of one
//! [`SharedState`] always share it.
//!
//! The arena is laid out by the program, as ExecuTorch's runtime lays it out: a value is its
//! planned offset, so two methods' views of one buffer are the same bytes whatever their
//! names. Methods that share it run one at a time: each execute holds its lock.

use crate::aligned::AlignedBytes;
use crate::tensor::XNN_EXTRA_BYTES;
use parking_lot::{Mutex, MutexGuard};
use std::fmt;
use std::sync::Arc;

/// The memory id whose arena the methods of a program share.
pub const SHARED_MEMORY_ID: u32 = 2;

/// One instance of a program's shared mutable buffers, zero until a method writes them. Clones
/// are handles to the same instance.
#[derive(Clone)]
pub struct SharedState {
    arena: Arc<Mutex<AlignedBytes>>,
    /// The bytes methods may plan into (the arena holds XNNPACK's over-read slack after them).
    len: usize,
}

impl fmt::Debug for SharedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedState")
            .field("len", &self.len)
            .finish()
    }
}

impl SharedState {
    /// An arena of `len` zero bytes (the largest any method plans), plus XNNPACK's slack; None
    /// when that cannot be allocated.
    pub(crate) fn zeroed(len: usize) -> Option<SharedState> {
        let bytes = AlignedBytes::zeroed(len.checked_add(XNN_EXTRA_BYTES)?, 64)?;
        Some(SharedState {
            arena: Arc::new(Mutex::new(bytes)),
            len,
        })
    }

    /// The bytes methods may plan into.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no method plans anything into it.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `other` is a handle to the same instance.
    pub fn same_as(&self, other: &SharedState) -> bool {
        Arc::ptr_eq(&self.arena, &other.arena)
    }

    /// The arena, for one execute (or one method's initial values): methods sharing it wait
    /// for each other here.
    pub(crate) fn lock(&self) -> MutexGuard<'_, AlignedBytes> {
        self.arena.lock()
    }

    /// A copy of `len` bytes at `offset`, or None outside the arena (for tests and tools that
    /// look at a buffer between calls).
    pub fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len)?;
        Some(self.lock().as_slice()[offset..end].to_vec())
    }
}
