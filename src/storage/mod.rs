//! The file-system calls a durable write makes, behind one small trait: creating a file,
//! writing and syncing it, renaming it, syncing its directory, mapping it, locking, removing.
//! [`OsStorage`] makes the real calls; the test support's `FaultyStorage` makes the same calls and fails,
//! tears or cuts the power under them on request, so tests can show that every call of a save
//! may fail without losing a file.
//!
//! Only what changes the disk, or reads what a save just wrote, goes through the trait. Checks
//! of what is at a path (`symlink_metadata`, listing a directory) stay direct: a fault there
//! only changes which error a caller reports.
//!
//! The files a save creates beside the cache (its temporary, the writer lock) are side files:
//! [`OsStorage`] opens them without following a symbolic link and without blocking, accepts only
//! a regular file, and creates them with the permission bits the caller gives.

use crate::mmap::MappedFile;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// A file being written: its bytes reach the disk only once [`sync`](Self::sync) returns.
pub trait StorageFile: Write + Send {
    /// Makes everything written so far durable (`fsync`), through a map of the file too.
    fn sync(&mut self) -> io::Result<()>;
    /// Makes the file at least `len` bytes long, with disk blocks allocated for all of them
    /// (`fallocate`), so that writes through a map of it cannot fail for want of space. Fails
    /// without effect (`ENOSPC`, or `EOPNOTSUPP` on a file system that cannot allocate ahead).
    fn allocate(&mut self, len: u64) -> io::Result<()>;
    /// Cuts the file to exactly `len` bytes (`ftruncate`).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// The open file, to map it (`crate::mmap::FileWindow`).
    fn file(&self) -> &File;
}

/// Where files are created, written, renamed, synced, mapped and locked.
pub trait Storage: Send + Sync {
    /// Creates the file at `path`, which must not exist (a symbolic link there, even to nothing,
    /// is an existing file), empty and open for writing, with permission bits `mode` (less the
    /// umask) from the moment it exists.
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<Box<dyn StorageFile>>;
    /// Renames `from` over `to`, atomically replacing whatever file `to` names.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries durable: a file created or renamed in it survives a
    /// power cut only after this.
    fn sync_directory(&self, dir: &Path) -> io::Result<()>;
    /// Maps the regular file at `path` read-only, surviving its truncation
    /// ([`MappedFile::open_watched`]).
    fn map(&self, path: &Path) -> io::Result<MappedFile>;
    /// Takes the exclusive advisory lock on the file at `path` (created if absent, with
    /// permission bits `mode` less the umask), held until the returned file is closed, waiting at
    /// most [`WRITER_LOCK_WAIT`] for another holder (then `TimedOut`): a writer stopped or hung in
    /// another process never blocks this one. Something other than a regular file at `path` (a
    /// FIFO, a symbolic link, dangling or not) is neither followed nor waited on: the error is
    /// `InvalidInput`, and nothing is created.
    fn lock_exclusive(&self, path: &Path, mode: u32) -> io::Result<File>;
    /// Removes the file at `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// The process id written into temporary names: a temporary whose process is gone is
    /// abandoned and may be removed by anyone.
    fn process_id(&self) -> u32 {
        std::process::id()
    }
}

/// The longest a save waits for another process's writer lock before it gives up (the file is
/// then left as it is, and the packed weights stay in memory).
pub const WRITER_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsStorage;

impl StorageFile for File {
    fn sync(&mut self) -> io::Result<()> {
        self.sync_all()
    }

    fn allocate(&mut self, len: u64) -> io::Result<()> {
        allocate(self, len)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn file(&self) -> &File {
        self
    }
}

/// Creates the side file at `path` as [`OsStorage`] does: not through a symbolic link, never
/// blocking, a regular file only, with permission bits `mode`.
pub fn create_side_file(path: &Path, mode: u32) -> io::Result<File> {
    crate::side_file::create_new(path, mode)
}

/// `fallocate` of `file` up to `len` bytes (mode 0: the size grows, blocks are allocated).
pub fn allocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length past off_t"))?;
    loop {
        // SAFETY: the descriptor is open for as long as `file` is borrowed; fallocate takes no
        // pointer.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Storage for OsStorage {
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(crate::side_file::create_new(path, mode)?))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_directory(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn map(&self, path: &Path) -> io::Result<MappedFile> {
        MappedFile::open_watched(path)
    }

    fn lock_exclusive(&self, path: &Path, mode: u32) -> io::Result<File> {
        let file = crate::side_file::open_lock(path, mode)?;
        let deadline = std::time::Instant::now() + WRITER_LOCK_WAIT;
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another process has held the writer lock for over {} s",
                        WRITER_LOCK_WAIT.as_secs()
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// A shared [`Storage`], as options hold it: the default is the operating system's; two
/// handles are equal when they are the same storage object.
#[derive(Clone)]
pub struct SharedStorage(Arc<dyn Storage>);

impl SharedStorage {
    /// Wraps `storage`.
    pub fn new(storage: Arc<dyn Storage>) -> SharedStorage {
        SharedStorage(storage)
    }

    /// The storage itself.
    pub fn get(&self) -> &dyn Storage {
        &*self.0
    }

    fn address(&self) -> *const () {
        Arc::as_ptr(&self.0).cast()
    }
}

impl Default for SharedStorage {
    fn default() -> SharedStorage {
        static OS: OnceLock<SharedStorage> = OnceLock::new();
        OS.get_or_init(|| SharedStorage(Arc::new(OsStorage)))
            .clone()
    }
}

impl PartialEq for SharedStorage {
    fn eq(&self, other: &SharedStorage) -> bool {
        self.address() == other.address()
    }
}

impl Eq for SharedStorage {}

impl fmt::Debug for SharedStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == SharedStorage::default() {
            f.write_str("SharedStorage(os)")
        } else {
            write!(f, "SharedStorage({:p})", self.address())
        }
    }
}
