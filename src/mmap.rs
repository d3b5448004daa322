//! Read-only memory maps of files: the one place xnnblob maps memory.
//!
//! Mapping is unsafe because the bytes can change, or vanish (SIGBUS), if another process
//! modifies or truncates the file while it is mapped. xnnblob never writes to or truncates a
//! file in place once published: writers build a temporary file and rename it over the old
//! one, which leaves existing maps on the old inode intact. Files modified in place by someone
//! else are outside what any reader can defend against; the parsers only ever trust bytes
//! they have validated.

use memmap2::Mmap;
use std::fs::File;
use std::io;
use std::path::Path;

/// The bytes of a file, mapped read-only (or empty for an empty file, which cannot be mapped).
pub struct MappedFile {
    map: Option<Mmap>,
}

impl MappedFile {
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

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}
