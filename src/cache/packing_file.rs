//! The cache file a launch packs into. Past the first packed bytes a launch keeps on the heap
//! ([`HeapFirst`](super::HeapFirst): a small model's, for which starting a file costs more than
//! packing), each packed weight goes into a new file beside the cache (a [`publish::Draft`]):
//! XNNPACK packs it into a staging buffer reused from weight to weight, which is written into
//! the file at once (`pwrite`), so the bytes are written once into the file and the heap never
//! holds more than the weights being packed. A save completes the file (the
//! entries it keeps from older files copied after the packed ones, then the index, the header
//! and the trailer of `docs/cache-format.md`), syncs it and renames it into place, so nothing is
//! published before it is durable and a kill leaves the old file or the new one.
//!
//! Layout while it is made: the header's 128 bytes are left for the save; packed regions follow,
//! each at a multiple of 64, in the order XNNPACK reserved them. A reservation never used (its
//! packing lost a race with another thread's, or came after the save took the draft) is a hole
//! no index entry names; the format allows them.
//!
//! Memory: the file is mapped in windows whose addresses never move (XNNPACK keeps the
//! addresses it is given). A window spans address space only; the file is allocated
//! (`fallocate`) ahead of every byte handed out, so no write through a window can fault for
//! want of disk space, and a file system that cannot allocate ahead is not drafted on (the
//! cache packs on the heap, as in memory).

use super::checksum::checksum64;
use super::format::{self, Compat, FileEntry, HEADER_SIZE, REGION_ALIGNMENT};
use crate::mmap::{FileIdentity, FileWindow, MappedFile};
use crate::publish;
use crate::storage::{SharedStorage, StorageFile};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// The address space the first window spans; later windows double it. Address space only: on a
/// 64-bit machine 1 GiB of it costs nothing, and a 1B-parameter model's packed weights fit.
const FIRST_WINDOW: usize = if usize::BITS >= 64 { 1 << 30 } else { 64 << 20 };
/// Windows start at multiples of this: a page on every kernel XNNPACK runs on (4, 16 or 64 KiB).
const WINDOW_ALIGNMENT: u64 = 64 << 10;
/// The most the file is allocated past what is handed out: one call per several weights, and
/// what is allocated beyond the last region is cut off by the save. A small draft is allocated
/// as far again as it is long, no further: the kernel fills an allocated file's pages with zeros
/// as they are first touched, by readahead's windows, and a 30 KiB model's launch spent longer
/// zeroing and then dropping 8 MiB of them than packing.
const ALLOCATE_STEP: u64 = 8 << 20;
/// Allocations end at multiples of this.
const ALLOCATE_ALIGNMENT: u64 = 64 << 10;

/// Where a packed region lies in a draft: a window and an offset in it. Its bytes stay readable
/// for as long as the window lives, published or not.
#[derive(Clone)]
pub(crate) struct Space {
    pub window: Arc<FileWindow>,
    pub at: usize,
}

impl Space {
    /// The region's offset in the file.
    pub fn file_offset(&self) -> u64 {
        self.window.file_offset() + self.at as u64
    }

    /// The region's first `len` bytes, once written.
    pub fn bytes(&self, len: usize) -> &[u8] {
        self.window.bytes(self.at, len)
    }

    /// Writes `packed` (XNNPACK's packing of the region, made in a staging buffer) into the
    /// region, and returns its checksum, summed while the bytes are fresh in the CPU's cache so
    /// that no save reads the region again. A cold launch maps none of the file's pages: the
    /// runtime maps them from the page cache when it first runs, as a warm launch does.
    pub fn fill(&self, packed: &[u8]) -> io::Result<u64> {
        let sum = checksum64(packed);
        self.window.write_through_file(self.at, packed)?;
        Ok(sum)
    }
}

/// A cache file being made.
pub(crate) struct DraftFile {
    draft: publish::Draft,
    file: Box<dyn StorageFile>,
    windows: Vec<Arc<FileWindow>>,
    /// The end of the last region handed out.
    end: u64,
    /// How long the file is, every byte of it allocated.
    allocated: u64,
}

/// A save's row: an entry to write, with its packed bytes wherever they are now.
pub(crate) struct Row<'a> {
    pub entry: FileEntry,
    /// In a draft (maybe this one: then it stays where it is).
    pub space: Option<&'a Space>,
    /// Its bytes, for a copy.
    pub bytes: &'a [u8],
}

/// What [`DraftFile::publish`] made: the published file mapped read-only, and each row's entry
/// with its offset.
pub(crate) type Published = (MappedFile, Vec<FileEntry>);

impl DraftFile {
    /// Starts a draft of the cache file `destination`, with permission bits `mode`, once its
    /// writer's mark is made (see `persist::writer_began_since_written`).
    pub fn create(storage: SharedStorage, destination: &Path, mode: u32) -> io::Result<DraftFile> {
        super::persist::mark_draft_began(destination, mode);
        let (draft, file) = publish::Draft::create(storage, destination, mode)?;
        let window = FileWindow::map(file.file(), 0, FIRST_WINDOW)?;
        Ok(DraftFile {
            draft,
            file,
            windows: vec![Arc::new(window)],
            end: HEADER_SIZE as u64,
            allocated: 0,
        })
    }

    /// `n` bytes at a multiple of `alignment` (at most a window's alignment), allocated in the
    /// file, never handed out before.
    pub fn reserve(&mut self, n: usize, alignment: u64) -> io::Result<Space> {
        let too_long = || io::Error::new(io::ErrorKind::InvalidInput, "a region past u64");
        let n64 = n as u64;
        let mut offset = self.end.next_multiple_of(alignment);
        let last = self.windows.last().expect("a draft has a window").clone();
        let last_end = last.file_offset() + last.len() as u64;
        let window = if offset.checked_add(n64).ok_or_else(too_long)? <= last_end {
            last
        } else {
            offset = offset.next_multiple_of(WINDOW_ALIGNMENT);
            let len =
                (last.len().saturating_mul(2)).max(n.next_multiple_of(WINDOW_ALIGNMENT as usize));
            let window = Arc::new(FileWindow::map(self.file.file(), offset, len)?);
            self.windows.push(window.clone());
            window
        };
        let end = offset + n64;
        if end > self.allocated {
            let to = end
                .checked_add(end.min(ALLOCATE_STEP))
                .and_then(|to| to.checked_next_multiple_of(ALLOCATE_ALIGNMENT))
                .ok_or_else(too_long)?;
            self.file.allocate(to)?;
            self.allocated = to;
        }
        self.end = end;
        let at = (offset - window.file_offset()) as usize;
        Ok(Space { at, window })
    }

    /// Whether more than a quarter of what was handed out is not among `kept` (the bytes of
    /// the entries a save keeps that lie here): regions whose packing lost a race with another
    /// thread's (eight threads loading one program at once each pack every weight), or entries
    /// forgotten since. Publishing the draft would keep them as holes; the file is written anew
    /// instead, tightly, at the cost of writing its bytes a second time.
    pub fn mostly_holes(
        &self,
        kept: impl Iterator<Item = Space>,
        sizes: impl Iterator<Item = usize>,
    ) -> bool {
        let handed_out = self.end - HEADER_SIZE as u64;
        let kept: u64 = kept
            .zip(sizes)
            .filter(|(s, _)| self.holds(s))
            .map(|(_, n)| n as u64)
            .sum();
        handed_out.saturating_sub(kept) > handed_out / 4
    }

    /// Whether `space` lies in this draft.
    pub fn holds(&self, space: &Space) -> bool {
        self.windows.iter().any(|w| Arc::ptr_eq(w, &space.window))
    }

    /// Completes the file and publishes it as `destination`: each row that lies in this draft
    /// stays where it is; the others are copied after the regions packed into it; then the
    /// index with `sources`, the header for `compat` and the trailer are written, the file is
    /// cut to its length, synced, mapped read-only (what was written, whoever renames next) and
    /// renamed into place. On an error the draft is removed and nothing is published.
    pub fn publish<'a>(
        mut self,
        destination: &Path,
        compat: &Compat,
        rows: impl Iterator<Item = Row<'a>>,
        sources: &[FileIdentity],
    ) -> io::Result<Published> {
        let mut written = Vec::new();
        for row in rows {
            let mut entry = row.entry;
            entry.size = row.bytes.len() as u64;
            match row.space.filter(|s| self.holds(s)) {
                Some(space) => entry.offset = space.file_offset(),
                None => {
                    let space = self.reserve(row.bytes.len(), REGION_ALIGNMENT as u64)?;
                    space.window.write_through_file(space.at, row.bytes)?;
                    entry.offset = space.file_offset();
                }
            }
            written.push(entry);
        }
        // Listed in key order, as every file is (a launch searches its index in place).
        written.sort_by_key(|e| e.key);
        // The index goes after everything handed out, regions still being packed included. Its
        // length does not depend on where it goes.
        let tail_len = format::encode_index(&written, sources, 0).len();
        let space = self.reserve(tail_len, 8)?;
        let tail = format::encode_index(&written, sources, space.file_offset());
        space.window.write_through_file(space.at, &tail)?;
        let len = space.file_offset() + tail_len as u64;
        self.windows[0].write_through_file(0, &format::encode_header(compat))?;
        self.file.set_len(len)?;
        self.file.flush()?;
        self.file.sync()?;
        let map = self.draft.storage().get().map(self.draft.path())?;
        let DraftFile { draft, windows, .. } = self;
        draft.publish(destination)?;
        // Published, so anyone who may write the file may cut it short under the windows.
        for w in &windows {
            w.watch(len.saturating_sub(w.file_offset()) as usize);
        }
        Ok((map, written))
    }
}
