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

/// A draft: a temporary sibling of a destination that is written over a long time, through a
/// map, while its process runs (the packed-weight cache a cold launch packs into), and published
/// by [`put_in_place`] once synced. Its name carries the draft infix
/// (`.<name>.xnnblob-draft-<pid>-<n>`): unlike a save's temporary it is made without the
/// writer lock, so it is reclaimed only once its process is gone, never by a live writer's save.
/// Removed when dropped unless published.
#[cfg(feature = "xnnpack")]
pub(crate) struct Draft {
    storage: crate::storage::SharedStorage,
    temporary: PathBuf,
    published: bool,
}

/// The drafts open in this process: a reclaim never takes them, whatever their names say.
#[cfg(feature = "xnnpack")]
fn open_drafts() -> &'static parking_lot::Mutex<Vec<PathBuf>> {
    static OPEN: std::sync::OnceLock<parking_lot::Mutex<Vec<PathBuf>>> = std::sync::OnceLock::new();
    OPEN.get_or_init(Default::default)
}

#[cfg(feature = "xnnpack")]
impl Draft {
    /// Creates an empty draft beside `destination`, with permission bits `mode`.
    pub(crate) fn create(
        storage: crate::storage::SharedStorage,
        destination: &Path,
        mode: u32,
    ) -> io::Result<(Draft, Box<dyn StorageFile>)> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let name = destination
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let temporary = directory_of(destination).join(format!(
            "{}{}-{}",
            draft_prefix(name),
            storage.get().process_id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        open_drafts().lock().push(temporary.clone());
        let file = match storage.get().create_new(&temporary, mode) {
            Ok(file) => file,
            Err(e) => {
                open_drafts().lock().retain(|p| *p != temporary);
                return Err(e);
            }
        };
        Ok((
            Draft {
                storage,
                temporary,
                published: false,
            },
            file,
        ))
    }

    /// The storage it is made in.
    pub(crate) fn storage(&self) -> &crate::storage::SharedStorage {
        &self.storage
    }

    /// Where the draft is.
    pub(crate) fn path(&self) -> &Path {
        &self.temporary
    }

    /// Renames the draft (complete and synced by the caller) over `destination`.
    pub(crate) fn publish(mut self, destination: &Path) -> io::Result<()> {
        put_in_place(self.storage.get(), &self.temporary, destination)?;
        self.published = true;
        Ok(())
    }
}

#[cfg(feature = "xnnpack")]
impl Drop for Draft {
    fn drop(&mut self) {
        if !self.published {
            let _ = self.storage.get().remove(&self.temporary);
        }
        open_drafts().lock().retain(|p| *p != self.temporary);
    }
}

/// What every draft of a destination named `name` begins with.
#[cfg(feature = "xnnpack")]
fn draft_prefix(name: &std::ffi::OsStr) -> String {
    format!(".{}.xnnblob-draft-", name.to_string_lossy())
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

/// The process id in `file_name`, if it is exactly a temporary's name for the destination
/// whose temporaries begin with `prefix`: the prefix, then a process id and a sequence number
/// in decimal digits joined by one `-`, and nothing else.
#[cfg(feature = "xnnpack")]
fn temporary_pid(file_name: &std::ffi::OsStr, prefix: &str) -> Option<libc::pid_t> {
    let (pid, sequence) = file_name.to_str()?.strip_prefix(prefix)?.split_once('-')?;
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !decimal(pid) || !decimal(sequence) {
        return None;
    }
    sequence.parse::<u64>().ok()?;
    pid.parse::<libc::pid_t>().ok().filter(|&pid| pid > 0)
}

/// Removes the temporaries of `destination` left by writers that no longer run (a save killed
/// midway), and the [`Draft`]s of processes that are gone. Only a writer holding the destination's writer lock makes temporaries, so with
/// `writers_locked` (the caller holds that lock) every temporary is abandoned, whoever's process
/// id its name carries: a pid reused by an unrelated process does not keep it. Without the lock
/// a temporary is abandoned when the process its name carries is gone (a gone process will never
/// publish it); a live process's, this process's, and any whose name does not parse are kept.
/// Only regular files owned by this process's user are removed: anything else under such a
/// name (a directory, a link, another user's file) was not made by this user's saves.
/// Returns how many were removed.
#[cfg(feature = "xnnpack")]
pub(crate) fn reclaim_abandoned(
    storage: &dyn Storage,
    destination: &Path,
    writers_locked: bool,
) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Some(name) = destination.file_name() else {
        return 0;
    };
    let prefix = temporary_prefix(name);
    let Ok(entries) = fs::read_dir(directory_of(destination)) else {
        return 0;
    };
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    let user = unsafe { libc::geteuid() };
    let mut removed = 0;
    let drafts = draft_prefix(name);
    for entry in entries.flatten() {
        // A save's temporary, or a draft: a draft is made without the writer lock, so holding
        // it says nothing about drafts; only their process's end does.
        let (pid, locked) = match temporary_pid(&entry.file_name(), &prefix) {
            Some(pid) => (pid, writers_locked),
            None => match temporary_pid(&entry.file_name(), &drafts) {
                Some(pid) => (pid, false),
                None => continue,
            },
        };
        let path = entry.path();
        let ours =
            fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file() && m.uid() == user);
        if !ours || open_drafts().lock().contains(&path) {
            continue;
        }
        let abandoned = locked || (pid as u32 != std::process::id() && !process_exists(pid));
        if abandoned && storage.remove(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether process `pid` exists (signal 0 checks without sending anything; a process of another
/// user exists too).
#[cfg(feature = "xnnpack")]
fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only reports whether `pid` can be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
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

    fn siblings(dir: &Path) -> Vec<String> {
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

    #[test]
    #[cfg(feature = "xnnpack")]
    fn temporaries_of_writers_that_are_gone_are_reclaimed_and_no_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        fs::write(&path, b"published").unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let own = std::process::id();
        let names = [
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-0"),
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-7"),
            format!(".weights.xbc.xnnblob-tmp-{own}-3"),
            // pid 1 always runs.
            ".weights.xbc.xnnblob-tmp-1-0".to_string(),
            ".weights.xbc.xnnblob-tmp-garbage".to_string(),
            format!(".other.xbc.xnnblob-tmp-{gone_pid}-0"),
        ];
        for n in &names {
            fs::write(dir.path().join(n), b"part").unwrap();
        }
        assert_eq!(reclaim_abandoned(&OsStorage, &path, false), 2);
        let mut kept: Vec<String> = names[2..].to_vec();
        kept.push("weights.xbc".into());
        kept.sort();
        assert_eq!(siblings(dir.path()), kept);
        // Under the writer lock no writer runs: a live pid's temporary (pid 1 here) and this
        // process's are abandoned too; names that do not parse and other files' are kept.
        assert_eq!(reclaim_abandoned(&OsStorage, &path, true), 2);
        let mut kept = vec![
            format!(".other.xbc.xnnblob-tmp-{gone_pid}-0"),
            ".weights.xbc.xnnblob-tmp-garbage".to_string(),
            "weights.xbc".to_string(),
        ];
        kept.sort();
        assert_eq!(siblings(dir.path()), kept);
    }

    /// The real file system, naming its temporaries and drafts as the process it holds the id of
    /// would: a test playing a process that has died.
    struct AsProcess(u32);

    impl Storage for AsProcess {
        fn create_new(&self, path: &Path, mode: u32) -> io::Result<Box<dyn StorageFile>> {
            OsStorage.create_new(path, mode)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            OsStorage.rename(from, to)
        }
        fn sync_directory(&self, dir: &Path) -> io::Result<()> {
            OsStorage.sync_directory(dir)
        }
        fn map(&self, path: &Path) -> io::Result<crate::mmap::MappedFile> {
            OsStorage.map(path)
        }
        fn lock_exclusive(&self, path: &Path, mode: u32) -> io::Result<std::fs::File> {
            OsStorage.lock_exclusive(path, mode)
        }
        fn remove(&self, path: &Path) -> io::Result<()> {
            OsStorage.remove(path)
        }
        fn process_id(&self) -> u32 {
            self.0
        }
    }

    #[test]
    #[cfg(feature = "xnnpack")]
    fn drafts_are_reclaimed_only_once_their_process_is_gone_even_under_the_writer_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let dead = format!(".weights.xbc.xnnblob-draft-{gone_pid}-999999");
        // pid 1 always runs: a draft of a live process, which packs into it through a map.
        let live = ".weights.xbc.xnnblob-draft-1-4".to_string();
        for n in [&dead, &live] {
            fs::write(dir.path().join(n), b"packed").unwrap();
        }
        // This process's own open draft, named with a dead pid (as a test plays a dying
        // process): never taken while it is open.
        let storage = crate::storage::SharedStorage::new(std::sync::Arc::new(AsProcess(gone_pid)));
        let (open, _file) = Draft::create(storage, &path, 0o600).unwrap();
        let open_name = open
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(reclaim_abandoned(&OsStorage, &path, true), 1);
        let mut kept = vec![live.clone(), open_name.clone()];
        kept.sort();
        assert_eq!(siblings(dir.path()), kept);
        drop(open);
        assert_eq!(
            siblings(dir.path()),
            [live],
            "an unpublished draft is removed when dropped"
        );
    }

    /// Issue 38: a user's `.NAME.tmp-1-notes` beside the cache was deleted by the next save.
    #[test]
    #[cfg(feature = "xnnpack")]
    fn a_users_file_that_looks_like_a_temporary_is_never_reclaimed() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        fs::write(&path, b"published").unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let look_alikes = [
            ".weights.xbc.tmp-1-notes".to_string(),
            format!(".weights.xbc.tmp-{gone_pid}-0"),
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-1-notes"),
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-1.bak"),
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-"),
            format!(".weights.xbc.xnnblob-tmp-+{gone_pid}-1"),
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-+1"),
            format!(".weights.xbc.xnnblob-tmp-{gone_pid}-99999999999999999999999"),
            ".weights.xbc.xnnblob-tmp-0-1".to_string(),
            ".weights.xbc.xnnblob-tmp--1-1".to_string(),
        ];
        for n in &look_alikes {
            fs::write(dir.path().join(n), b"the user's").unwrap();
        }
        // Well-formed names that are not this user's regular files.
        let a_directory = format!(".weights.xbc.xnnblob-tmp-{gone_pid}-2");
        fs::create_dir(dir.path().join(&a_directory)).unwrap();
        let a_link = format!(".weights.xbc.xnnblob-tmp-{gone_pid}-3");
        std::os::unix::fs::symlink(&path, dir.path().join(&a_link)).unwrap();
        let another_users = format!(".weights.xbc.xnnblob-tmp-{gone_pid}-4");
        let theirs = dir.path().join(&another_users);
        fs::write(&theirs, b"theirs").unwrap();
        let other_uid = fs::metadata(&theirs).unwrap().uid() ^ 1;
        // Only root can give a file away; elsewhere the case is left out.
        let given_away = std::process::Command::new("chown")
            .arg(other_uid.to_string())
            .arg(&theirs)
            .status()
            .is_ok_and(|s| s.success());
        if !given_away {
            eprintln!("not root: the other user's file case is skipped");
            fs::remove_file(&theirs).unwrap();
        }
        let before = siblings(dir.path());
        assert_eq!(reclaim_abandoned(&OsStorage, &path, true), 0);
        assert_eq!(siblings(dir.path()), before);
        for n in &look_alikes {
            assert_eq!(fs::read(dir.path().join(n)).unwrap(), b"the user's", "{n}");
        }
        assert_eq!(fs::read(&path).unwrap(), b"published", "the link's target");
    }
}
