//! Memory maps: the one place xnnblob maps memory. Read-only maps of published files
//! ([`MappedFile`]), the shared windows of a cache file being made (`FileWindow`, a draft only
//! its own process writes, with `pwrite`, until it is published), and anonymous memory
//! ([`anonymous`]: pages of a buffer's own, and reserved address space for deferred constants).
//!
//! Mapping is unsafe because the bytes can change, or vanish (SIGBUS), if another process
//! modifies or truncates the file while it is mapped. xnnblob never writes to or truncates a
//! file in place once published: writers build a temporary file (or a draft) and rename it over
//! the old one, which leaves existing maps on the old inode intact. Files modified in place by
//! someone else are outside what any reader can defend against; the parsers only ever trust
//! bytes they have validated, and maps of cache files survive truncation (`truncation.rs`).

pub mod anonymous;
mod truncation;

pub use truncation::any_fault;

use memmap2::{Mmap, UncheckedAdvice};
use std::io;
use std::path::Path;

/// The bytes of a file, mapped read-only (or empty for an empty file, which cannot be mapped).
pub struct MappedFile {
    // Dropped before `map`: the watch must end before the pages it covers are unmapped.
    watch: Option<truncation::Watch>,
    map: Option<Mmap>,
    identity: FileIdentity,
    /// Its status change time (`ctime`) when mapped, in nanoseconds since the Unix epoch.
    changed_ns: i128,
}

/// Which version of which file: device, inode, size and modification time, as `fstat` tells
/// them. A file replaced (by rename, or rewritten and given a new mtime) gets another identity;
/// one rewritten in place with the same size and its old mtime put back does not, which is what
/// trusting an identity rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// The device the file is on.
    pub device: u64,
    /// Its inode number.
    pub inode: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Its modification time, in nanoseconds since the Unix epoch (0 before it).
    pub modified_ns: u64,
}

impl FileIdentity {
    /// The identity `metadata` describes.
    pub fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        let modified_ns = u64::try_from(metadata.mtime())
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(metadata.mtime_nsec().max(0) as u64);
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.len(),
            modified_ns,
        }
    }
}

/// A file's status change time (`ctime`) as `metadata` tells it, in nanoseconds since the Unix
/// epoch: moved by every write, truncation or rename, and set back by no call.
pub fn changed_ns(metadata: &std::fs::Metadata) -> i128 {
    use std::os::unix::fs::MetadataExt;
    i128::from(metadata.ctime()) * 1_000_000_000 + i128::from(metadata.ctime_nsec())
}

impl MappedFile {
    /// Maps the file at `path` read-only as it is now; a file later renamed over `path` does
    /// not change what this map reads.
    /// Anything but a regular file (a directory, a FIFO, a device) is refused with
    /// [`io::ErrorKind::InvalidInput`], without blocking: opening a FIFO for reading would wait
    /// for a writer forever.
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}, not a regular file", kind_of(&metadata.file_type())),
            ));
        }
        let identity = FileIdentity::of(&metadata);
        let changed_ns = changed_ns(&metadata);
        if metadata.len() == 0 {
            return Ok(MappedFile {
                watch: None,
                map: None,
                identity,
                changed_ns,
            });
        }
        let len = usize::try_from(metadata.len())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: see the module docs: published files are replaced by rename, never modified
        // in place, and every byte read from the map is validated before use. The length is
        // the one just read of this descriptor (given, the map does not ask the kernel again).
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&file)? };
        Ok(MappedFile {
            watch: None,
            map: Some(map),
            identity,
            changed_ns,
        })
    }

    /// As [`open`](Self::open), and survives the file being cut short while mapped: a read past
    /// its new end gives zeros instead of killing the process with SIGBUS, and
    /// [`lost_pages`](Self::lost_pages) tells. For files whose bytes have checksums or whose
    /// readers can fail cleanly (the packed-weight cache).
    pub fn open_watched(path: &Path) -> io::Result<MappedFile> {
        let mut mapped = MappedFile::open(path)?;
        if let Some(map) = &mapped.map {
            mapped.watch = truncation::Watch::start(map);
        }
        Ok(mapped)
    }

    /// Whether a read of this map found its file cut short (only for a map made by
    /// [`open_watched`](Self::open_watched)): from the first page read past the file's new end,
    /// the map reads as zeros, and nothing computed from those bytes is right.
    pub fn lost_pages(&self) -> bool {
        self.watch.as_ref().is_some_and(truncation::Watch::faulted)
    }

    /// The identity of the file as it was when mapped.
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// The file's status change time (`ctime`) when mapped, in nanoseconds since the Unix
    /// epoch.
    pub fn changed_ns(&self) -> i128 {
        self.changed_ns
    }

    /// The whole file as mapped, valid as long as `self` (empty for an empty file).
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Drops the resident pages wholly inside `[offset, offset + len)`. They are read back
    /// from the file, unchanged, if touched again.
    pub fn release_pages(&self, offset: usize, len: usize) {
        let Some(map) = &self.map else { return };
        if let Some((start, end)) = whole_pages(offset, len, map.len()) {
            // SAFETY: the map is private and read-only, so MADV_DONTNEED only discards clean
            // pages that the kernel re-reads from the file on the next access; no Rust
            // reference observes a change. A failure only means the pages stay resident.
            let _ = unsafe {
                map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// Whether the pages at `samples` evenly spaced offsets are all in the page cache (a cheap
    /// guess at "the file was read recently"; `mincore` per sampled page).
    pub fn looks_resident(&self, samples: usize) -> bool {
        const PAGE: usize = 4096;
        let Some(map) = &self.map else { return true };
        let pages = map.len().div_ceil(PAGE);
        (0..samples.max(1)).all(|i| {
            let page = pages.saturating_sub(1) * i / samples.max(2).saturating_sub(1).max(1);
            let mut resident = 0u8;
            // SAFETY: the address is page-aligned (a map starts on a page) and the one page
            // lies inside the mapping; mincore only writes one byte to `resident`.
            let ok = unsafe {
                libc::mincore(
                    map.as_ptr().add(page * PAGE) as *mut libc::c_void,
                    PAGE,
                    &mut resident,
                )
            } == 0;
            !ok || resident & 1 == 1
        })
    }

    /// Starts reading the whole file into the page cache (`MADV_WILLNEED`). The kernel queues
    /// the reads and returns once they are submitted, which for a large file takes a while:
    /// call it off the critical path.
    pub fn read_ahead(&self) {
        let Some(map) = &self.map else { return };
        // A failure only means no read ahead.
        let _ = map.advise(memmap2::Advice::WillNeed);
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

/// The size of the pages `madvise` and `mmap` work in (4 KiB on x86-64; 4, 16 or 64 KiB on
/// aarch64 kernels).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// The pages wholly inside `[offset, offset + len)` of a mapping `map_len` bytes long, as
/// `[start, end)` offsets, if there is one: what a release may drop without touching the bytes
/// around the range, which others may be using.
fn whole_pages(offset: usize, len: usize, map_len: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let start = offset.checked_next_multiple_of(page)?;
    let end = offset.saturating_add(len).min(map_len) / page * page;
    (start < end).then_some((start, end))
}

/// A window of a file being written, mapped shared and read-only at a fixed offset of the file:
/// the cache file a cold launch packs into (see `cache/packing_file.rs`), whose bytes are written
/// through the file ([`write_through_file`](Self::write_through_file)) and read through the
/// window. The window may reach past the file's end; its owner makes the file long enough (with
/// its blocks allocated) before it hands out any byte of the window, so no write fails for want
/// of disk space. The window's address never changes, so the packed weights it holds may be
/// given to XNNPACK for good.
#[cfg(feature = "xnnpack")]
pub(crate) struct FileWindow {
    // Dropped before `map`, as in `MappedFile`.
    watch: parking_lot::Mutex<Option<truncation::Watch>>,
    map: memmap2::MmapRaw,
    /// The file, to write packed bytes into it without mapping its pages (see
    /// [`write_through_file`](Self::write_through_file)).
    file: std::fs::File,
    /// The offset in the file of the window's first byte.
    file_offset: u64,
}

#[cfg(feature = "xnnpack")]
impl FileWindow {
    /// Maps `len` bytes of `file` from `file_offset` (a multiple of the page size), shared and
    /// read-only.
    pub(crate) fn map(
        file: &std::fs::File,
        file_offset: u64,
        len: usize,
    ) -> io::Result<FileWindow> {
        let map = memmap2::MmapOptions::new()
            .offset(file_offset)
            .len(len)
            .map_raw_read_only(file)?;
        Ok(FileWindow {
            watch: parking_lot::Mutex::new(None),
            map,
            file: file.try_clone()?,
            file_offset,
        })
    }

    /// The offset in the file of the window's first byte.
    pub(crate) fn file_offset(&self) -> u64 {
        self.file_offset
    }

    /// How many bytes the window spans (not all of them need be in the file yet).
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The `len` bytes of the window from `at`, which must lie inside the file and must have
    /// been written (a packed region XNNPACK finished, a copy this process made): nothing writes
    /// them again while they are borrowed.
    pub(crate) fn bytes(&self, at: usize, len: usize) -> &[u8] {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.map.len()),
            "{len} bytes at {at} are past a window of {}",
            self.map.len()
        );
        // SAFETY: the range lies inside the mapping (checked above), which lives as long as
        // `self`; the caller's contract says no one writes it while it is read, and the file
        // reaches it (the owner allocated it first), so reading it does not fault.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(at), len) }
    }

    /// Writes `bytes` into the file at the window's byte `at` with `pwrite`, not through the map:
    /// the kernel copies them into the page cache, where the window sees them, and maps none of
    /// the window's pages (a write through a map would fault each page in, reading it first).
    /// The range must lie inside the file and be written by no one else.
    pub(crate) fn write_through_file(&self, at: usize, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        assert!(
            at.checked_add(bytes.len())
                .is_some_and(|end| end <= self.map.len()),
            "{} bytes at {at} are past a window of {}",
            bytes.len(),
            self.map.len()
        );
        self.file.write_all_at(bytes, self.file_offset + at as u64)
    }

    /// From now on, survives the file being cut short under the window's first `len` bytes, as
    /// [`MappedFile::open_watched`] does: once the file is published, anyone who may write it
    /// could truncate it.
    pub(crate) fn watch(&self, len: usize) {
        let len = len.min(self.map.len());
        let mut watch = self.watch.lock();
        if watch.is_none() && len > 0 {
            // SAFETY: the first `len` bytes lie inside the mapping, which outlives the watch
            // (dropped first); the slice is only used for its address and length.
            let bytes = unsafe { std::slice::from_raw_parts(self.map.as_ptr(), len) };
            *watch = truncation::Watch::start(bytes);
        }
    }

    /// Whether a read of the watched part found the file cut short (see
    /// [`MappedFile::lost_pages`]).
    pub(crate) fn lost_pages(&self) -> bool {
        self.watch
            .lock()
            .as_ref()
            .is_some_and(truncation::Watch::faulted)
    }
}

/// What a file type is, for messages: "a directory", "a FIFO", ...
pub fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Asks the kernel to read the pages under `bytes` now, and only those: where `bytes` is part
/// of a file mapping (an ExecuTorch mmap loader's segment, say), touching it later would
/// otherwise fault in a whole read-around window (the device's readahead, 8 MiB on some disks)
/// for a constant of a few KiB. The pages arrive in the background; anonymous memory is left
/// as it is. Advice only: nothing is changed, and a failure changes nothing either.
pub fn advise_read_soon(bytes: &[u8]) {
    const PAGE: usize = 4096;
    if bytes.is_empty() {
        return;
    }
    let start = bytes.as_ptr() as usize / PAGE * PAGE;
    let end = (bytes.as_ptr() as usize + bytes.len()).next_multiple_of(PAGE);
    // SAFETY: [start, end) covers only pages that hold `bytes`, which are mapped for as long
    // as the borrow lives; MADV_WILLNEED changes neither contents nor mapping (it starts
    // readahead of a file mapping's pages), and a failure (memory it does not apply to) is
    // ignored.
    let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_WILLNEED) };
}

/// Maps in this library's writable data (its `.data` and `.bss`; not what is read-only after
/// relocation), every page made the process's own, on the calling thread. XNNPACK, linked into
/// the library, keeps each operator's configuration in `.bss` behind a `pthread_once` that reads
/// before it writes: the first launch to create an operator of a kind then takes a
/// copy-on-write fault whose flush of the old mapping interrupts every other core the process
/// runs on (in a VM, an exit per core). Done at the library's load, on a thread of its own, a
/// launch takes none of them. Costs the data's pages (about 50 KiB), which its first launches
/// mostly touch anyway. Advice only: a kernel before Linux 5.14 refuses it, and nothing changes.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn map_in_own_data() {
    for (start, end) in own_writable_ranges() {
        // SAFETY: [start, end) is writable memory of this library, mapped for the process's
        // life; MADV_POPULATE_WRITE faults its pages in as a write would, changing no byte of
        // them. A refusal (an older kernel, a page not writable after all) is ignored.
        let _ = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }
}

/// The page ranges [`map_in_own_data`] maps in: the writable segments of the object that holds
/// this code (a shared library, or the executable it is linked into), past what is read-only
/// after relocation.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn own_writable_ranges() -> Vec<(usize, usize)> {
    /// The object holding `marker`, and its ranges (of whole `page`s) once found.
    struct Search {
        marker: usize,
        page: usize,
        ranges: Vec<(usize, usize)>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader hands a valid `dl_phdr_info` for the call, whose program headers
        // (`dlpi_phnum` of them at `dlpi_phdr`) it keeps mapped; `data` is the `Search` passed
        // to `dl_iterate_phdr` below, borrowed by nothing else during it.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let headers = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        let base = info.dlpi_addr as usize;
        // (type, flags, start, end) of each segment, whatever the ELF class.
        let segments = headers.iter().map(|h| {
            let start = base.wrapping_add(h.p_vaddr as usize);
            (
                h.p_type,
                h.p_flags,
                start,
                start.wrapping_add(h.p_memsz as usize),
            )
        });
        let ours = segments.clone().any(|(kind, _, start, end)| {
            kind == libc::PT_LOAD && (start..end).contains(&search.marker)
        });
        if !ours {
            return 0;
        }
        let relro_end = segments
            .clone()
            .filter(|&(kind, ..)| kind == libc::PT_GNU_RELRO)
            .map(|(.., end)| end.next_multiple_of(search.page))
            .max()
            .unwrap_or(0);
        for (kind, flags, start, end) in segments {
            if kind != libc::PT_LOAD || flags & libc::PF_W == 0 {
                continue;
            }
            let start = (start / search.page * search.page).max(relro_end);
            let end = end.next_multiple_of(search.page);
            if start < end {
                search.ranges.push((start, end));
            }
        }
        1
    }
    let mut search = Search {
        marker: map_in_own_data as *const () as usize,
        // The system's, not 4 KiB: madvise refuses a range that does not begin on one (16 KiB
        // and 64 KiB pages on some aarch64 kernels).
        page: page_size(),
        ranges: Vec::new(),
    };
    // SAFETY: `each` only reads what the loader hands it and writes `search`, which outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut search as *mut Search as *mut libc::c_void) };
    search.ranges
}

/// Elsewhere nothing is mapped in ahead.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn map_in_own_data() {}

#[cfg(test)]
mod tests {
    use super::{MappedFile, page_size, whole_pages};
    use std::io::Write;

    #[test]
    fn a_release_takes_only_the_pages_wholly_inside_its_range() {
        let page = page_size();
        // Inside one page: nothing.
        assert_eq!(whole_pages(10, page - 20, 8 * page), None);
        // Straddling: only the pages it covers from end to end.
        assert_eq!(whole_pages(10, 3 * page, 8 * page), Some((page, 3 * page)));
        assert_eq!(
            whole_pages(page, 2 * page, 8 * page),
            Some((page, 3 * page))
        );
        // Never past the mapping.
        assert_eq!(whole_pages(0, 20 * page, 2 * page + 5), Some((0, 2 * page)));
        assert_eq!(whole_pages(usize::MAX - 3, 10, usize::MAX), None);
    }

    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn the_binarys_writable_data_is_mapped_in_ahead() {
        use std::sync::atomic::{AtomicU8, Ordering};
        // Zero and writable: in this test binary's `.bss`, which nothing else here touches.
        const LEN: usize = 1 << 18;
        static UNTOUCHED: [AtomicU8; LEN] = [const { AtomicU8::new(0) }; LEN];
        let page = page_size();
        let start = (UNTOUCHED.as_ptr() as usize).next_multiple_of(page);
        let pages = (UNTOUCHED.as_ptr() as usize + LEN - start) / page;
        let end = start + pages * page;
        assert!(
            super::own_writable_ranges()
                .iter()
                .any(|&(from, to)| from <= start && end <= to),
            "the ranges hold the binary's .bss"
        );
        let resident = |start: usize, pages: usize| {
            let mut flags = vec![0u8; pages];
            // SAFETY: [start, start + pages * page) is mapped (by the caller) for the call;
            // mincore writes one byte per page into `flags`.
            let status = unsafe {
                libc::mincore(start as *mut libc::c_void, pages * page, flags.as_mut_ptr())
            };
            assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
            flags.iter().filter(|&&f| f & 1 == 1).count()
        };
        // Whether this system maps pages in when asked: qemu's user mode takes the advice and
        // does nothing, Linux before 5.14 refuses it.
        let mut probe = super::anonymous::OwnPages::zeroed(4 * page).unwrap();
        let at = probe.as_mut_ptr();
        // SAFETY: the probe's four pages are mapped, writable, for its life.
        let asked =
            unsafe { libc::madvise(at as *mut libc::c_void, 4 * page, libc::MADV_POPULATE_WRITE) };
        if asked != 0 || resident(at as usize, 4) != 4 {
            eprintln!(
                "NOT CHECKED: this system does not map pages in on MADV_POPULATE_WRITE \
                 (qemu's user mode, or Linux before 5.14); only the ranges were checked"
            );
            return;
        }
        assert!(
            resident(start, pages) < pages,
            "UNTOUCHED was touched before the test"
        );
        super::map_in_own_data();
        assert_eq!(
            resident(start, pages),
            pages,
            "every page of the binary's .bss is mapped in"
        );
        assert!(UNTOUCHED.iter().all(|b| b.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn a_file_out_of_the_page_cache_is_seen_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("packed");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 4 << 20]).unwrap();
        f.sync_all().unwrap();
        assert!(MappedFile::open(&path).unwrap().looks_resident(16));
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor; the advice changes no data.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        let map = MappedFile::open(&path).unwrap();
        if map.looks_resident(16) {
            eprintln!("skipped: this file system keeps dropped pages (tmpfs?)");
            return;
        }
        // Read back (with read(), not through the map): resident again.
        assert_eq!(std::fs::read(&path).unwrap().len(), 4 << 20);
        assert!(map.looks_resident(16));
    }
}
