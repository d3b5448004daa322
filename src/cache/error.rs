//! What can go wrong with a packed-weight cache: only I/O, and files that are not the cache's
//! own; bad packed bytes are rebuilt, not reported as errors.

use std::path::PathBuf;

/// An error of the cache: only I/O can fail; bad files are rebuilt, not reported as errors.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Reading, writing, locking, syncing or renaming a cache file failed.
    #[error("packed-weight cache {path}")]
    Io {
        /// The file the operation failed on, as displayed: the cache file, or its `.lock`
        /// sibling when taking the writer lock failed.
        path: String,
        /// The operating system's error.
        #[source]
        error: std::io::Error,
    },
    /// The cache path, or its writer lock (`PATH.lock`), names something other than a regular
    /// file (a directory, a FIFO, a device, a symbolic link to nothing; for the lock, any
    /// symbolic link): it is neither read nor replaced, and nothing is created through it.
    #[error(
        "packed-weight cache {path}: {kind}, not a regular file; it is neither read nor replaced"
    )]
    NotARegularFile {
        /// The path as given (made absolute), or its lock's.
        path: PathBuf,
        /// What is there ("a directory", "a FIFO", ...).
        kind: &'static str,
    },
    /// A non-empty file that is not an xnnblob packed-weight cache is at the path (a user's
    /// file, the program's own data): it is neither read nor replaced.
    #[error(
        "packed-weight cache {path}: the file there is not a packed-weight cache; it is neither \
         read nor replaced"
    )]
    NotACacheFile {
        /// The path as given (made absolute).
        path: PathBuf,
    },
    /// The cache file was cut short in place (by another process) while mapped: packed weights
    /// read past its new end are zeros, so the runtimes that use them give wrong outputs
    /// until they are created again (then they pack those weights anew).
    #[error(
        "packed-weight cache {path}: the file was cut short while mapped; runtimes created \
         before that read zeros for some packed weights and must be created again"
    )]
    Truncated {
        /// The file cut short: the cache's own, or one of its read-only layers.
        path: PathBuf,
    },
    /// The file is open in this process already, with other options: one file has one cache
    /// object, and it cannot follow two sets of options.
    #[error("packed-weight cache {path}: already open in this process with other options")]
    OpenWithOtherOptions {
        /// The canonical path of the cache file that is open already.
        path: PathBuf,
    },
}
