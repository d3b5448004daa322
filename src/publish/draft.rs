//! Drafts: files published once a long write is done (the packed-weight cache a
//! cold launch packs into), and the reclaim of what writers that are gone left behind, drafts
//! and temporaries alike. Only the packed-weight cache makes drafts, so this part needs
//! XNNPACK (the `xnnpack` feature) where the rest of publishing does not.

use super::{directory_of, put_in_place, temporary_prefix};
use crate::storage::{Storage, StorageFile};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A draft: a temporary sibling of a destination that is written over a long time, through a
/// map, while its process runs (the packed-weight cache a cold launch packs into), and published
/// by [`put_in_place`] once synced. Its name carries the draft infix
/// (`.<name>.xnnblob-draft-<pid>-<n>`): unlike a save's temporary it is made without the
/// writer lock, so it is reclaimed only once its process is gone, never by a live writer's save.
/// Removed when dropped unless published.
pub(crate) struct Draft {
    storage: crate::storage::SharedStorage,
    temporary: PathBuf,
    published: bool,
}

/// The drafts open in this process: a reclaim never takes them, whatever their names say.
fn open_drafts() -> &'static parking_lot::Mutex<Vec<PathBuf>> {
    static OPEN: std::sync::OnceLock<parking_lot::Mutex<Vec<PathBuf>>> = std::sync::OnceLock::new();
    OPEN.get_or_init(Default::default)
}

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

impl Drop for Draft {
    fn drop(&mut self) {
        if !self.published {
            let _ = self.storage.get().remove(&self.temporary);
        }
        open_drafts().lock().retain(|p| *p != self.temporary);
    }
}

/// What every draft of a destination named `name` begins with.
fn draft_prefix(name: &std::ffi::OsStr) -> String {
    format!(".{}.xnnblob-draft-", name.to_string_lossy())
}

/// The process id in `file_name`, if it is exactly a temporary's name for the destination
/// whose temporaries begin with `prefix`: the prefix, then a process id and a sequence number
/// in decimal digits joined by one `-`, and nothing else.
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
/// Says how many were removed, and how many names of temporaries or drafts were left.
pub(crate) fn reclaim_abandoned(
    storage: &dyn Storage,
    destination: &Path,
    writers_locked: bool,
) -> Reclaimed {
    use std::os::unix::fs::MetadataExt;
    let mut reclaimed = Reclaimed {
        removed: 0,
        kept: 0,
    };
    let Some(name) = destination.file_name() else {
        return reclaimed;
    };
    let prefix = temporary_prefix(name);
    let Ok(entries) = fs::read_dir(directory_of(destination)) else {
        // Unread, so nothing is known to be gone.
        reclaimed.kept = 1;
        return reclaimed;
    };
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    let user = unsafe { libc::geteuid() };
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
            reclaimed.kept += 1;
            continue;
        }
        let abandoned = locked || (pid as u32 != std::process::id() && !process_exists(pid));
        if abandoned && storage.remove(&path).is_ok() {
            reclaimed.removed += 1;
        } else {
            reclaimed.kept += 1;
        }
    }
    reclaimed
}

/// What [`reclaim_abandoned`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reclaimed {
    /// Temporaries and drafts removed.
    pub(crate) removed: usize,
    /// Those left (a live writer's, this process's, another user's, or not regular files),
    /// or 1 where the directory could not be read.
    pub(crate) kept: usize,
}

/// Whether process `pid` exists (signal 0 checks without sending anything; a process of another
/// user exists too).
fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only reports whether `pid` can be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::tests::siblings;
    use crate::storage::OsStorage;

    /// The id of a process that has exited: what it left behind is abandoned.
    fn gone_pid() -> u32 {
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        pid
    }

    #[test]
    fn temporaries_of_writers_that_are_gone_are_reclaimed_and_no_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        fs::write(&path, b"published").unwrap();
        let gone_pid = gone_pid();
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
        assert_eq!(reclaim_abandoned(&OsStorage, &path, false).removed, 2);
        let mut kept: Vec<String> = names[2..].to_vec();
        kept.push("weights.xbc".into());
        kept.sort();
        assert_eq!(siblings(dir.path()), kept);
        // Under the writer lock no writer runs: a live pid's temporary (pid 1 here) and this
        // process's are abandoned too; names that do not parse and other files' are kept.
        assert_eq!(reclaim_abandoned(&OsStorage, &path, true).removed, 2);
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
    fn drafts_are_reclaimed_only_once_their_process_is_gone_even_under_the_writer_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        let gone_pid = gone_pid();
        let dead = format!(".weights.xbc.xnnblob-draft-{gone_pid}-999999");
        // pid 1 always runs: a draft of a live process, which packs into it.
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
        assert_eq!(reclaim_abandoned(&OsStorage, &path, true).removed, 1);
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
    fn a_users_file_that_looks_like_a_temporary_is_never_reclaimed() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.xbc");
        fs::write(&path, b"published").unwrap();
        let gone_pid = gone_pid();
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
        assert_eq!(reclaim_abandoned(&OsStorage, &path, true).removed, 0);
        assert_eq!(siblings(dir.path()), before);
        for n in &look_alikes {
            assert_eq!(fs::read(dir.path().join(n)).unwrap(), b"the user's", "{n}");
        }
        assert_eq!(fs::read(&path).unwrap(), b"published", "the link's target");
    }
}
