//! The record that a cache file's packed bytes were checked against their checksums, kept
//! beside it (`PATH.checked`), so that a launch hashes them again only after the file changed.
//!
//! A change is what the file's status shows: its inode (a save renames a new file over it),
//! size, and change time (`ctime`), which every write, truncation or mapping write moves and
//! which no call can set back. Damage below the file system that leaves these as they were (a
//! failing sector the drive does not report) is found by `xnnblob cache verify`, or at every
//! open with [`VerifyPacked::BeforeUse`](super::VerifyPacked::BeforeUse).
//!
//! The record is a hint: absent, unreadable, torn or foreign, the bytes are checked again. It
//! is written only for a file whose change time is older than the record by more than one tick
//! of its file system's clock ([`settle_time`]), because a change in the same tick as the last
//! one would leave the change time as it was (2 s on FAT, a few ms on ext4 and f2fs).
//!
//! It is a side file (`crate::side_file`): anything at its path but a regular file (a FIFO, a
//! device, a symbolic link, to `/dev/zero` or anywhere else) counts as no record and is left as
//! it is, and no more than [`RECORD_CAP`] bytes of it are ever read.

use super::format::{CheckedRecord as Checked, DamageRecord};
use crate::mmap::{FileIdentity, MappedFile};
use crate::side_file;
use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How much older than the record the file's last change must be for the record to be made,
/// on a file system whose clock is not known to tick finer (`settle_time`).
pub const SETTLED: Duration = Duration::from_secs(2);

/// On the file systems whose change times the kernel keeps to the nanosecond, updated at least
/// once per scheduler tick (ext4, XFS, Btrfs, F2FS, tmpfs, overlayfs): more than a tick at the
/// lowest tick rate Linux builds with (100 Hz).
const FINE_CLOCK_SETTLED: Duration = Duration::from_millis(20);

/// How long a file at `path` must be left unchanged before its change time can tell any later
/// change: [`FINE_CLOCK_SETTLED`] where its file system keeps a fine clock, [`SETTLED`] anywhere
/// else (FAT's clock ticks every 2 s).
pub fn settle_time(path: &Path) -> Duration {
    use std::os::unix::ffi::OsStrExt;
    const FINE: [i64; 6] = [
        0xEF53,      // ext2/3/4
        0x5846_5342, // XFS
        0x9123_683E, // Btrfs
        0xF2F5_2010, // F2FS
        0x0102_1994, // tmpfs
        0x794C_7630, // overlayfs
    ];
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return SETTLED;
    };
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and outlives the call; `fs` is writable.
    if unsafe { libc::statfs(name.as_ptr(), &mut fs) } != 0 {
        return SETTLED;
    }
    if FINE.contains(&(fs.f_type as i64)) {
        FINE_CLOCK_SETTLED
    } else {
        SETTLED
    }
}

/// The most of a file at the record's path that is read: a record is one line of about 100
/// bytes, so anything longer is not one.
pub const RECORD_CAP: u64 = 4096;

/// The status of the file `map` maps, if the file at `path` is still that file.
fn of_mapped(path: &Path, map: &MappedFile) -> Option<Checked> {
    let metadata = std::fs::metadata(path).ok()?;
    if FileIdentity::of(&metadata) != map.identity() {
        return None;
    }
    Some(Checked {
        device: metadata.dev(),
        inode: metadata.ino(),
        size: metadata.len(),
        changed_ns: crate::mmap::changed_ns(&metadata),
    })
}

/// The record's path: the cache file's, with `.checked` appended.
pub fn record_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".checked");
    PathBuf::from(name)
}

/// What the regular file `file` holds, if it is no longer than [`RECORD_CAP`].
fn read_record(file: &mut File) -> Option<Vec<u8>> {
    side_file::read_capped(file, RECORD_CAP).ok().flatten()
}

/// Whether the record beside `path` says the file `map` maps was checked as it was when mapped:
/// the status its map took of its own descriptor (asked of the file at `path` again, it would
/// only be the same or another file's, which no record of this one matches).
pub fn is_recorded(path: &Path, map: &MappedFile) -> bool {
    let identity = map.identity();
    let now = Checked {
        device: identity.device,
        inode: identity.inode,
        size: identity.size,
        changed_ns: map.changed_ns(),
    };
    let Ok(mut file) = side_file::open(&record_path(path), OpenOptions::new().read(true)) else {
        return false;
    };
    read_record(&mut file).is_some_and(|text| Checked::parse(&text) == Some(now))
}

/// The file's status before its bytes are checked: [`record`] writes the record only if the
/// file is still in it afterwards.
#[derive(Debug, Clone, Copy)]
pub struct Before(Checked);

/// The status of the file `map` maps, if the file at `path` is still that file, and it has not
/// changed for its [`settle_time`] (otherwise no record can be trusted for it yet).
pub fn before_check(path: &Path, map: &MappedFile) -> Option<Before> {
    let checked = of_mapped(path, map)?;
    let taken_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_nanos() as i128;
    let settled = settle_time(path).as_nanos() as i128;
    (checked.changed_ns + settled <= taken_ns).then_some(Before(checked))
}

/// Records that every packed byte of the file `map` maps was checked, if the file at `path` is
/// the one [`before_check`] saw, unchanged since. A new record gets permission bits `mode` (less
/// the umask). Best effort: a record that cannot be written only means the next launch checks
/// again.
pub fn record(path: &Path, map: &MappedFile, before: Before, mode: u32) {
    // A change during the check moved the change time past when `before` was taken, which
    // was a settle time after the change before it: no tick of the clock can hide it.
    if of_mapped(path, map) != Some(before.0) {
        return;
    }
    // One descriptor for the check and the write, so what is checked is what is written.
    let opened = side_file::open(
        &record_path(path),
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(mode),
    );
    // Anything there that is not a regular file stays as it is.
    let Ok(mut file) = opened else {
        return;
    };
    // A regular file that is not a record of ours (a user's notes) stays too. Empty, or begun
    // as a record (one torn by a crash), it is ours: just created, or left by an earlier write.
    let ours = read_record(&mut file)
        .is_some_and(|text| text.is_empty() || text.starts_with(Checked::MAGIC.as_bytes()));
    if !ours {
        return;
    }
    let text = before.0.to_text();
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(text.as_bytes()));
}

/// Moves the record's own change time to now, if the record is one of ours: a launch that read
/// the cache's directory because a writer began since the file was written (see
/// `persist::writer_began_since_written`), and found nothing of a save left there, spares the
/// launches after it the same reading until a writer begins again. Only the record's
/// times change, never its text (which holds the cache file's status, not its own) nor the
/// directory (a new file or a rename would change its time again). Best effort.
pub fn mark_directory_read(path: &Path) {
    let Ok(mut file) = side_file::open(&record_path(path), OpenOptions::new().read(true)) else {
        return;
    };
    if read_record(&mut file).is_some_and(|text| text.starts_with(Checked::MAGIC.as_bytes())) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// Where the record of a cache file that cannot be written (an app's read-only bundle) is kept:
/// in the user's state directory (`state_dir`, else `$XDG_STATE_HOME/xnnblob`, else
/// `$HOME/.local/state/xnnblob`), under `read-only-caches/`, named by the hash of the file's
/// absolute path. None where there is no such directory, or it cannot be made: the caller then
/// checks the file before use instead.
pub fn elsewhere_path(path: &Path, state_dir: Option<&Path>) -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = match state_dir {
        Some(dir) => dir.to_path_buf(),
        None => match std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
            Some(dir) => PathBuf::from(dir).join("xnnblob"),
            None => PathBuf::from(std::env::var_os("HOME").filter(|d| !d.is_empty())?)
                .join(".local/state/xnnblob"),
        },
    };
    let dir = base.join("read-only-caches");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .ok()?;
    let absolute = std::path::absolute(path).ok()?;
    let digest = crate::sha256::sha256(absolute.as_os_str().as_encoded_bytes());
    let name = crate::sha256::to_hex(&digest[..16]);
    Some(dir.join(format!("{name}.damage")))
}

/// The damage record at `record`, opened to be written (made, private, where there is none; a
/// regular file only).
fn open_damage_record(record: &Path) -> std::io::Result<File> {
    side_file::open(
        record,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(side_file::PRIVATE_MODE),
    )
}

/// Whether what a check of the file `map` maps finds could be remembered at `record` (a record
/// path of [`elsewhere_path`]): the file has been unchanged for its [`settle_time`] and a regular
/// file can be written at `record` (made empty where there is none, which reads as no record).
/// Where it cannot (a state directory that cannot be written, a FIFO or a link at the record's
/// path, a file changed within its settle time), a check after use would be forgotten and the
/// damage it found served again at the next launch: the caller checks the file before use.
pub fn can_remember(record: &Path, path: &Path, map: &MappedFile) -> bool {
    before_check(path, map).is_some() && open_damage_record(record).is_ok()
}

/// The damaged entries' offsets that the record at `record` remembers of the file `map` maps,
/// if the record is of the file at `path` as it is now (an empty list: checked, all intact).
pub fn remembered_damage(record: &Path, path: &Path, map: &MappedFile) -> Option<Vec<u64>> {
    let now = of_mapped(path, map)?;
    let mut file = side_file::open(record, OpenOptions::new().read(true)).ok()?;
    let text = read_record(&mut file)?;
    let remembered = DamageRecord::parse(&text)?;
    (remembered.file == now).then_some(remembered.damaged)
}

/// Remembers, at `record`, that the file `map` maps was checked and which entries (by offset)
/// failed, if the file at `path` is the one [`before_check`] saw, unchanged since, and no more
/// than [`DamageRecord::MAX_DAMAGED`] failed. Returns whether it was remembered.
pub fn remember_damage(
    record: &Path,
    path: &Path,
    map: &MappedFile,
    before: Before,
    damaged: &[u64],
) -> bool {
    if of_mapped(path, map) != Some(before.0) || damaged.len() > DamageRecord::MAX_DAMAGED {
        return false;
    }
    let mut damaged = damaged.to_vec();
    damaged.sort_unstable();
    damaged.dedup();
    let text = DamageRecord {
        file: before.0,
        damaged,
    }
    .to_text();
    let Ok(mut file) = open_damage_record(record) else {
        return false;
    };
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(text.as_bytes()))
        .is_ok()
}
