//! Named data: opaque blobs (weights, scales, ...) stored under unique keys ahead of time and
//! fetched by key at run time, zero-copy, byte-compatible with ExecuTorch's `.ptd` files and
//! the named data of `.pte` programs.
//!
//! - [`NamedDataMap`]: the run-time interface, over [`FileDataMap`] (`.ptd`/`.pte`),
//!   [`InMemoryMap`] and [`MergedMap`].
//! - [`NamedBlobStore`]: the ahead-of-time writer of `.ptd` files.
//! - [`ptd_format`], [`pte_format`]: pure, validating parsers over `&[u8]`.

mod buffer;
pub(crate) mod bytes;
mod copies;
mod error;
mod file_map;
mod index;
mod layout;
mod memory;
mod merged;
pub mod ptd_format;
pub mod pte_format;
mod store;

pub use buffer::{Backing, DataBuffer};
pub use copies::{copied_bytes, count_copy};
pub use error::{FormatError, NamedDataError, StoreError};
pub use file_map::{FileDataMap, FileKind};
pub use index::{IndexEntry, NamedDataIndex};
pub use layout::{ScalarType, TensorLayout};
pub use memory::InMemoryMap;
pub use merged::MergedMap;
pub use store::NamedBlobStore;
pub use store::write_atomically;

/// Data by key, as ExecuTorch's `NamedDataMap` offers it to backends. Lookups by key are hash
/// lookups; every implementation is shareable across threads.
pub trait NamedDataMap: Send + Sync {
    /// The bytes of `key`, zero-copy; the buffer keeps the backing memory alive.
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError>;

    /// The size in bytes of `key`'s data, without touching it.
    fn data_size(&self, key: &str) -> Result<usize, NamedDataError>;

    /// Whether [`data_size`](Self::data_size) tells a listed key's size without reading it. A
    /// delegate asks each constant it leaves unread its size, at every launch, only where it
    /// does (a refusal is an error value, a message made and dropped per constant).
    fn tells_sizes(&self) -> bool {
        true
    }

    /// The tensor layout stored with `key`; `Ok(None)` when the key was stored without one.
    fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError>;

    /// Copies `key`'s data into `buffer`, which must be exactly its size.
    fn load_data_into(&self, key: &str, buffer: &mut [u8]) -> Result<(), NamedDataError> {
        let data_size = self.data_size(key)?;
        if data_size != buffer.len() {
            return Err(NamedDataError::SizeMismatch {
                key: key.to_string(),
                data_size,
                buffer_size: buffer.len(),
            });
        }
        buffer.copy_from_slice(&self.get_data(key)?);
        count_copy(buffer.len());
        Ok(())
    }

    /// The number of keys; [`key_at`](Self::key_at) takes indices below it.
    fn num_keys(&self) -> usize;

    /// The key at `index` (0..num_keys), in the map's own order.
    fn key_at(&self, index: usize) -> Result<&str, NamedDataError>;

    /// Whether the map lists `key`, from its index alone: nothing is read. A delegate asks this
    /// of each constant it leaves unread, at every launch, so a map with an index by key answers
    /// from it; this default walks the keys.
    fn lists(&self, key: &str) -> bool {
        (0..self.num_keys()).any(|i| self.key_at(i).is_ok_and(|k| k == key))
    }

    /// What the map reads from (a path, or a name), for error messages.
    fn name(&self) -> &str;

    /// Whether the buffers [`get_data`](Self::get_data) returns borrow memory that is valid only
    /// while the program that lent this map lives (ExecuTorch's `FreeableBuffer`s): such data
    /// may be shared among the users of this map's [`name`](Self::name), never beyond.
    fn buffers_live_with_program(&self) -> bool {
        false
    }

    /// The identity of the file `key`'s bytes are read from, when the map knows it (a `.ptd` or
    /// `.pte` it mapped itself); None for memory, or a map that does not tell. A packed-weight
    /// cache checks a file's keys against its bytes once per identity.
    fn file_identity(&self, key: &str) -> Option<crate::mmap::FileIdentity> {
        let _ = key;
        None
    }
}

/// The largest power of two (up to 4096, a page) that divides `offset`: the alignment a
/// mapped segment starting there has.
pub fn alignment_of(offset: usize) -> usize {
    if offset == 0 {
        4096
    } else {
        (1usize << offset.trailing_zeros()).min(4096)
    }
}
