//! Read-only memory maps of files: the one place xnnblob maps memory.
//!
//! Mapping is unsafe because the bytes can change, or vanish (SIGBUS), if another process
//! modifies or truncates the file while it is mapped. xnnblob never writes to or truncates a
//! file in place once published: writers build a temporary file and rename it over the old
//! one, which leaves existing maps on the old inode intact. Files modified in place by someone
//! else are outside what any reader can defend against; the parsers only ever trust bytes
//! they have validated.

use memmap2::{Mmap, UncheckedAdvice};
use std::fs::File;
use std::io;
use std::path::Path;

/// The bytes of a file, mapped read-only (or empty for an empty file, which cannot be mapped).
pub struct MappedFile {
    map: Option<Mmap>,
}

impl MappedFile {
    /// Maps the file at `path` read-only as it is now; a file later renamed over `path` does
    /// not change what this map reads.
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: see the module docs: published files are replaced by rename, never modified
        // in place, and every byte read from the map is validated before use.
        let map = unsafe { Mmap::map(&file)? };
        Ok(MappedFile { map: Some(map) })
    }

    /// The whole file as mapped, valid as long as `self` (empty for an empty file).
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Drops the resident pages wholly inside `[offset, offset + len)`. They are read back
    /// from the file, unchanged, if touched again.
    pub fn release_pages(&self, offset: usize, len: usize) {
        const PAGE: usize = 4096;
        let Some(map) = &self.map else { return };
        let end = offset.saturating_add(len).min(map.len()) / PAGE * PAGE;
        let start = offset.next_multiple_of(PAGE);
        if start < end {
            // SAFETY: the map is private and read-only, so MADV_DONTNEED only discards clean
            // pages that the kernel re-reads from the file on the next access; no Rust
            // reference observes a change. A failure only means the pages stay resident.
            let _ = unsafe {
                map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// The start of the mapping (for address arithmetic on validated offsets).
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes().as_ptr()
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}
