//! Where a cache file may be: the checks a path passes before a cache is opened or made there
//! (a regular file that begins as a cache file does, or nothing, in a directory that takes new
//! files), and the canonical path the process's registry knows it by.

use super::{CacheAccess, PackedWeightsCache};
use crate::cache::error::CacheError;
use std::path::{Path, PathBuf};

/// [`CacheError::NotARegularFile`] when something other than a regular file is at `path`
/// (absence is fine: the first save creates the file). Symbolic links to files are resolved by
/// [`canonical`] before this; one left here points nowhere.
fn refuse_non_regular(path: &Path) -> Result<(), CacheError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => Err(CacheError::NotARegularFile {
            path: path.to_path_buf(),
            kind: if m.file_type().is_symlink() {
                "a symbolic link to nothing"
            } else {
                crate::mmap::kind_of(&m.file_type())
            },
        }),
        _ => Ok(()),
    }
}

/// Refuses a non-empty file that does not begin as a cache file does (its magic, less the
/// format version byte: a cache of an older format is still ours to rebuild). Only the first
/// bytes are read.
fn refuse_foreign(path: &Path) -> Result<(), CacheError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Without blocking: a FIFO put at the path since it was looked at must not stop the open.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let Ok(mut file) = opened else {
        // Absent (the save creates it) or unreadable (the load reports it).
        return Ok(());
    };
    let mut head = [0u8; 7];
    let mut got = 0;
    while got < head.len() {
        match file.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Ok(()),
        }
    }
    // A file cut short of the magic by a torn write is a damaged cache, not a user's file.
    if head[..got] == crate::cache::format::MAGIC[..got] {
        Ok(())
    } else {
        Err(CacheError::NotACacheFile {
            path: path.to_path_buf(),
        })
    }
}

impl PackedWeightsCache {
    /// Whether a cache file can live at `path`: nothing or a regular file is there, and its
    /// directory takes new files (the save writes a temporary file beside it and renames it into
    /// place). Asked of the kernel (`access(W_OK)`: permissions, a read-only mount, a missing
    /// directory) rather than by writing a probe file, so a warm launch writes nothing.
    pub fn check_path(path: &Path) -> Result<(), CacheError> {
        writable_directory(&vetted(path)?)
    }

    /// How a cache file at `path` can be used: [`check_path`](Self::check_path)'s answer, except
    /// that a cache file already there in a directory that takes no new files is
    /// [`CacheAccess::ReadOnly`] rather than an error.
    pub fn access_at(path: &Path) -> Result<CacheAccess, CacheError> {
        PackedWeightsCache::access_vetted(path).map(|(access, _)| access)
    }

    /// [`access_at`](Self::access_at)'s answer, with the path as [`open_vetted`] takes it
    /// where it was vetted: opening it then asks nothing of the file system twice.
    ///
    /// [`open_vetted`]: Self::open_vetted
    pub(crate) fn access_vetted(path: &Path) -> Result<(CacheAccess, Option<PathBuf>), CacheError> {
        let read_only = |e: CacheError| match e {
            CacheError::Io { .. } if std::fs::metadata(path).is_ok_and(|m| m.is_file()) => {
                Ok(CacheAccess::ReadOnly)
            }
            e => Err(e),
        };
        match vetted(path) {
            Ok(vetted) => match writable_directory(&vetted) {
                Ok(()) => Ok((CacheAccess::ReadWrite, Some(vetted))),
                Err(e) => read_only(e).map(|access| (access, Some(vetted))),
            },
            Err(e) => read_only(e).map(|access| (access, None)),
        }
    }
}

/// The canonical path of a cache file at `path`, where nothing but a regular file that begins
/// as a cache file does (or nothing) is there.
pub(super) fn vetted(path: &Path) -> Result<PathBuf, CacheError> {
    let path = canonical(path)?;
    refuse_non_regular(&path)?;
    refuse_foreign(&path)?;
    Ok(path)
}

/// Whether the directory of the cache file at the canonical `path` takes new files.
fn writable_directory(path: &Path) -> Result<(), CacheError> {
    use std::os::unix::ffi::OsStrExt;
    let io = |error| CacheError::Io {
        path: path.display().to_string(),
        error,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    // SAFETY: `dir` is a NUL-terminated path that lives across the call; access only reads it.
    if unsafe { libc::access(dir.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(io(std::io::Error::last_os_error()))
    }
}

/// The path a file is known by in the registry, whether or not it exists yet.
fn canonical(path: &Path) -> Result<PathBuf, CacheError> {
    let io = |error| CacheError::Io {
        path: path.display().to_string(),
        error,
    };
    if let Ok(p) = path.canonicalize() {
        return Ok(p);
    }
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    Ok(parent.canonicalize().map_err(io)?.join(name))
}
