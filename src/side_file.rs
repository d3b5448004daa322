//! The files xnnblob keeps beside a file it owns: a cache's writer lock (`PATH.lock`), its check
//! record (`PATH.checked`), and the temporaries a publish writes and renames into place.
//!
//! Whatever is at such a path may have been put there by anyone who can write the directory: a
//! FIFO (an open for reading waits for a writer forever), a device (`/dev/zero` reads without
//! end), a symbolic link (to a file outside the directory, or to nothing: an open that creates
//! would create its target). So a side file is opened
//! - with `O_NOFOLLOW`: a symbolic link is refused, never followed, so nothing outside the
//!   directory is opened or created;
//! - with `O_NONBLOCK`: no kind of file can make the open wait (it has no effect on a regular
//!   file's reads and writes);
//! - with `O_NOCTTY`: a terminal is never made the process's controlling one;
//! - with `O_CLOEXEC` (the standard library sets it): a child process does not inherit it;
//!
//! and is then accepted only if `fstat` of the opened descriptor says it is a regular file, so
//! what is checked is what is used. Reads of a side file are capped by its reader
//! ([`read_capped`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The room [`read_capped`] starts with: more than any record xnnblob writes beside a file.
const SMALL_READ: u64 = 512;

/// The permission bits xnnblob creates a file with when it does not know who may read the data
/// the file is made from (ExecuTorch creates its cache file so too).
pub const PRIVATE_MODE: u32 = 0o600;

/// What was found at a side file's path instead of a regular file. Carried inside the
/// [`io::Error`] of an open ([`io::ErrorKind::InvalidInput`]); [`refused_kind`] reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{kind}, not a regular file")]
pub(crate) struct NotRegular {
    /// What is there ("a FIFO", "a symbolic link", ...).
    pub kind: &'static str,
}

fn not_regular(kind: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, NotRegular { kind })
}

/// What an open refused to use instead of a regular file, if that is why `error` was returned.
#[cfg_attr(not(feature = "xnnpack"), allow(dead_code))]
pub(crate) fn refused_kind(error: &io::Error) -> Option<&'static str> {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<NotRegular>())
        .map(|n| n.kind)
}

/// Opens a writer lock's file at `path` (made with permission bits `mode`, less the umask, where
/// there is none) as [`open`] does, to be locked or marked. Read as well as write: a FIFO opened
/// for writing alone without blocking fails with ENXIO before its kind can be told; opened for
/// both, it is refused as a FIFO.
pub(crate) fn open_lock(path: &Path, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    open(
        path,
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(mode),
    )
}

/// Opens the side file at `path` as `options` say (read, write, create, mode), without following
/// a symbolic link and without blocking, and only if it is a regular file: anything else is an
/// [`io::ErrorKind::InvalidInput`] error carrying [`NotRegular`].
pub(crate) fn open(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path);
    let file = match file {
        Ok(file) => file,
        // `O_NOFOLLOW`'s refusal: the last component is a symbolic link (the directories above
        // it may be links too, so it is asked, not assumed).
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => not_regular("a symbolic link"),
                _ => e,
            });
        }
        Err(e) => return Err(e),
    };
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(crate::mmap::kind_of(&kind)));
    }
    Ok(file)
}

/// Creates the side file at `path`, which must not exist (`O_EXCL`, which never follows a
/// symbolic link either), for writing, with permission bits `mode` (less the umask) from the
/// moment it exists: no window in which it is more readable.
pub(crate) fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    open(
        path,
        // Readable too: a draft of a cache file is mapped shared and writable, which takes both.
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode),
    )
}

/// Reads the rest of `file`, if it holds at most `cap` bytes; None for a longer file, of which
/// at most `cap + 1` bytes are read.
#[cfg_attr(not(feature = "xnnpack"), allow(dead_code))]
pub(crate) fn read_capped(file: &mut File, cap: u64) -> io::Result<Option<Vec<u8>>> {
    // Room for a side file's usual contents (a line) up front: from an empty buffer the
    // standard library reads in probes of 32 bytes, four reads where two do (the contents and
    // the end of the file).
    let mut bytes = Vec::with_capacity(cap.saturating_add(1).min(SMALL_READ) as usize);
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= cap).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.lock");
        mkfifo(&fifo);
        // A blocking open for reading would wait here for a writer that never comes.
        let e = open(&fifo, OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(refused_kind(&e), Some("a FIFO"), "{e}");
        let e = open(
            &fifo,
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap_err();
        assert_eq!(refused_kind(&e), Some("a FIFO"), "{e}");
    }

    #[test]
    fn a_symbolic_link_is_never_followed_nor_its_target_created() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("created-by-nobody");
        let dangling = dir.path().join("x.lock");
        std::os::unix::fs::symlink(&target, &dangling).unwrap();
        let e = open(&dangling, OpenOptions::new().write(true).create(true)).unwrap_err();
        assert_eq!(refused_kind(&e), Some("a symbolic link"), "{e}");
        assert!(!target.exists());
        let zero = dir.path().join("x.checked");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = open(&zero, OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(refused_kind(&e), Some("a symbolic link"), "{e}");
        let e = create_new(&dangling, PRIVATE_MODE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert!(!target.exists());
    }

    #[test]
    fn a_created_side_file_has_the_mode_asked_for_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tmp");
        let file = create_new(&path, PRIVATE_MODE).unwrap();
        assert_eq!(file.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_read_stops_past_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.checked");
        std::fs::write(&path, [b'x'; 10]).unwrap();
        let mut file = open(&path, OpenOptions::new().read(true)).unwrap();
        assert_eq!(
            read_capped(&mut file, 10).unwrap().map(|b| b.len()),
            Some(10)
        );
        let mut file = open(&path, OpenOptions::new().read(true)).unwrap();
        assert_eq!(read_capped(&mut file, 9).unwrap(), None);
    }
}
