//! Publishing a file atomically and durably, the one way xnnblob replaces a file (a `.ptd`, a
//! `.pte`, a packed-weight cache): the new contents go to a temporary sibling, are synced, the
//! sibling is renamed over the destination, and the directory is synced. A crash at any point
//! leaves the old file or the complete new one under the destination's name, never a part.
//!
//! Temporary names carry the writer's process id: `.<name>.xnnblob-tmp-<pid>-<n>`, so what a
//! killed writer left behind can be told apart from a live writer's. The infix is xnnblob's own
//! and the name is parsed strictly (two decimal numbers, nothing else), so a user's file beside
//! the destination (`.<name>.tmp-1-notes`, `.<name>.xnnblob-tmp-1-2.bak`) is never taken for
//! one, and only a regular file of this user is ever reclaimed. A temporary is created
//! exclusively (`O_EXCL`, which follows no symbolic link) with its final permission bits.

#[cfg(feature = "xnnpack")]
mod draft;

#[cfg(feature = "xnnpack")]
pub(crate) use draft::{Draft, reclaim_abandoned};

use crate::storage::{Storage, StorageFile};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary sibling of a destination, removed unless published.
pub(crate) struct Staged<'s> {
    storage: &'s dyn Storage,
    temporary: PathBuf,
    destination: PathBuf,
    published: bool,
}

/// The directory `path` is in (`.` for a bare name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

impl<'s> Staged<'s> {
    /// Creates the temporary sibling of `destination` in `storage`, empty, for writing, with
    /// permission bits `mode` (less the umask): what the published file will have.
    pub(crate) fn create(
        storage: &'s dyn Storage,
        destination: &Path,
        mode: u32,
    ) -> io::Result<(Staged<'s>, Box<dyn StorageFile>)> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let name = destination
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let temporary = directory_of(destination).join(format!(
            "{}{}-{}",
            temporary_prefix(name),
            storage.process_id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let file = storage.create_new(&temporary, mode)?;
        let staged = Staged {
            storage,
            temporary,
            destination: destination.to_path_buf(),
            published: false,
        };
        Ok((staged, file))
    }

    /// Syncs and closes `file` (the one [`create`](Self::create) returned, fully written),
    /// runs `before_rename` on the temporary path (to map what was written, say), renames it
    /// over the destination and syncs the directory.
    pub(crate) fn publish<T>(
        mut self,
        mut file: Box<dyn StorageFile>,
        before_rename: impl FnOnce(&'s dyn Storage, &Path) -> io::Result<T>,
    ) -> io::Result<T> {
        file.flush()?;
        file.sync()?;
        drop(file);
        let value = before_rename(self.storage, &self.temporary)?;
        put_in_place(self.storage, &self.temporary, &self.destination)?;
        self.published = true;
        Ok(value)
    }
}

/// Renames `temporary` (complete and synced) over `destination` and syncs the directory: the
/// last step of every publish. A destination that is not a regular file is never replaced.
pub(crate) fn put_in_place(
    storage: &dyn Storage,
    temporary: &Path,
    destination: &Path,
) -> io::Result<()> {
    refuse_non_regular(destination)?;
    storage.rename(temporary, destination)?;
    storage.sync_directory(directory_of(destination))
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if !self.published {
            let _ = self.storage.remove(&self.temporary);
        }
    }
}

/// What every temporary of a destination named `name` begins with.
fn temporary_prefix(name: &std::ffi::OsStr) -> String {
    format!(".{}.xnnblob-tmp-", name.to_string_lossy())
}

/// Refuses a destination that exists and is not a regular file: a rename would replace a
/// device, a FIFO, a directory's entry or a symbolic link (dangling or not) with a regular file.
pub(crate) fn refuse_non_regular(destination: &Path) -> io::Result<()> {
    match fs::symlink_metadata(destination) {
        Ok(m) if !m.file_type().is_file() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a regular file: it is not replaced",
                destination.display(),
                crate::mmap::kind_of(&m.file_type())
            ),
        )),
        _ => Ok(()),
    }
}

/// Replaces `destination` with `bytes`, atomically and durably. The new file gets the
/// permission bits any new file gets (0666 less the umask).
pub(crate) fn write_atomically(destination: &Path, bytes: &[u8]) -> io::Result<()> {
    let (staged, mut file) = Staged::create(&crate::storage::OsStorage, destination, 0o666)?;
    file.write_all(bytes)?;
    staged.publish(file, |_, _| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::OsStorage;

    /// The names in `dir`, sorted (the drafts' tests list them too).
    pub(super) fn siblings(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_publish_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.ptd");
        fs::write(&path, b"old").unwrap();
        write_atomically(&path, b"new contents").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new contents");
        assert_eq!(siblings(dir.path()), ["model.ptd"]);
    }

    #[test]
    fn a_failed_or_abandoned_publish_keeps_the_old_file_and_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        fs::write(&path, b"old").unwrap();
        let (staged, mut file) = Staged::create(&OsStorage, &path, 0o600).unwrap();
        std::io::Write::write_all(&mut file, b"half").unwrap();
        let temporary = staged.temporary.clone();
        let name = temporary
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with(&format!(".weights.xbc.xnnblob-tmp-{}-", std::process::id())),
            "{name}"
        );
        let failed: io::Result<()> = staged.publish(file, |_, _| {
            Err(io::Error::other("refused before the rename"))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert!(!temporary.exists());
        let (abandoned, _file) = Staged::create(&OsStorage, &path, 0o600).unwrap();
        drop(abandoned);
        assert_eq!(siblings(dir.path()), ["weights.xbc"]);
    }

    #[test]
    fn a_publish_never_replaces_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a-directory");
        fs::create_dir(&sub).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"kept").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for path in [&sub, &dangling, &link] {
            let e = write_atomically(path, b"new").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        assert!(sub.is_dir());
        assert!(fs::symlink_metadata(&dangling).unwrap().is_symlink());
        assert_eq!(fs::read(&link).unwrap(), b"kept");
        assert_eq!(
            siblings(dir.path()),
            ["a-directory", "dangling", "link", "target"]
        );
    }
}
