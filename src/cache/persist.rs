//! Loading a cache file into the provider, and saving it back: the commit protocol of
//! `docs/cache-format.md` (lock, merge with what is on disk, write a temporary file, fsync,
//! rename, fsync the directory).

use super::CacheError;
use super::budget::{self, CacheBudget};
use super::checksum::checksum64;
use super::core::{CacheCore, Entry, Location, Source};
use super::format::{self, Compat, EntryKey, FileEntry, FileError};
use super::packing_file::Row;
use crate::mmap::{FileIdentity, MappedFile};
use crate::publish::Staged;
use crate::storage::Storage;
use std::collections::HashSet;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What opening a cache file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No file (or an in-memory cache): everything will be packed.
    Fresh,
    /// The file was valid; `dropped` entries failed their checks and will be repacked.
    Loaded {
        /// Entries that passed every check: XNNPACK finds their packed weights in the file.
        entries: usize,
        /// Entries that failed a check (bounds, alignment, overlap, duplicate key, flags).
        dropped: usize,
    },
    /// The whole file was rejected and will be rebuilt.
    Rejected(FileError),
}

fn io_error(path: &Path, error: std::io::Error) -> CacheError {
    CacheError::Io {
        path: path.display().to_string(),
        error,
    }
}

/// Maps `path` and adds its valid entries to the provider. A missing or invalid file is not an
/// error: the cache starts empty and the next save rebuilds the file.
///
/// With `prefetch`, a valid file that looks out of the page cache is read ahead on a background
/// thread (see [`CacheOptions::prefetch`](super::CacheOptions::prefetch)).
/// A cache file no larger than the kernel's default readahead window (128 KiB).
const SMALL_FILE: usize = 128 << 10;

pub(crate) fn load(
    core: &CacheCore,
    storage: &dyn Storage,
    path: &Path,
    compat: &Compat,
    prefetch: bool,
) -> Result<LoadOutcome, CacheError> {
    let map = match storage.map(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LoadOutcome::Fresh),
        Err(e) => return Err(io_error(path, e)),
    };
    // Only the header, index and trailer are read here: asked for exactly, a fault on each does
    // not read the device's readahead window around it (8 MiB on some disks) into the load. A
    // file within one readahead window of the smallest (a small model's) is asked for whole,
    // in one call.
    if map.bytes().len() <= SMALL_FILE {
        crate::mmap::advise_read_soon(map.bytes());
    } else {
        for range in format::metadata_ranges(map.bytes()) {
            crate::mmap::advise_read_soon(&map.bytes()[range]);
        }
    }
    let decoded = match format::decode(map.bytes(), compat) {
        Ok(d) => d,
        Err(e) => return Ok(LoadOutcome::Rejected(e)),
    };
    let map = Arc::new(map);
    if prefetch && !map.looks_resident(16) {
        let ahead = map.clone();
        // Without a thread the first inference faults the packed pages in as it goes.
        let _ = std::thread::Builder::new()
            .name("xnnblob-prefetch".into())
            .spawn(move || ahead.read_ahead());
    }
    let mut state = core.state.lock();
    let m = state.maps.len();
    state.maps.push(map);
    // Room for exactly the file's entries: pushed one by one, the index of a file of 85 entries
    // kept room for 128 (7 KiB for nothing). A look-up that misses later grows it as before.
    state.entries.reserve_exact(decoded.entries.len());
    state.insert_mapped_file(m, &decoded.entries);
    state.sources = decoded.sources.clone();
    Ok(LoadOutcome::Loaded {
        entries: decoded.entries.len(),
        dropped: decoded.dropped.len(),
    })
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}{suffix}"))
}

/// Holds the advisory lock that serialises writers of one cache file (readers need none: a
/// file is only ever replaced whole, by rename).
pub(crate) struct WriterLock(#[allow(dead_code)] File);

/// Takes the writer lock of the cache file at `path` (its `.lock` sibling, created with
/// permission bits `mode` if absent). Something other than a regular file there (a FIFO, a
/// symbolic link) is [`CacheError::NotARegularFile`], with nothing opened through it or created.
/// The lock is also the writer's mark: its modification time is moved to now before anything
/// is written beside the file (see [`writer_began_since_written`]).
pub(crate) fn lock_writers(
    storage: &dyn Storage,
    path: &Path,
    mode: u32,
) -> Result<WriterLock, CacheError> {
    let lock_path = lock_path(path);
    let f =
        storage.lock_exclusive(&lock_path, mode).map_err(
            |e| match crate::side_file::refused_kind(&e) {
                Some(kind) => CacheError::NotARegularFile {
                    path: lock_path.clone(),
                    kind,
                },
                None => io_error(&lock_path, e),
            },
        )?;
    mark_writer_began(&f);
    Ok(WriterLock(f))
}

/// The writer lock of the cache file at `path`: its `.lock` sibling.
pub(crate) fn lock_path(path: &Path) -> PathBuf {
    sibling(path, ".lock")
}

/// Moves the writer lock's modification time to now: what every writer of a cache file does
/// before it makes a temporary or a draft beside it, so that a launch can tell from the lock's
/// time alone whether one may have been left there since the file was written, without reading
/// the directory (an app's cache directory may hold thousands of files, and changes whenever
/// any of them does). Best effort: a writer whose mark failed leaves what it made to the next
/// save's reclaim, which reads the directory under the lock.
fn mark_writer_began(lock: &File) {
    use std::os::fd::AsRawFd;
    // The kernel's own time, as it sets a file's change time (`UTIME_NOW`), not the process's
    // clock: a mark read against change times set a moment later must not seem later than they.
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: `lock` is an open descriptor for the call's duration and `times` two timespecs,
    // which futimens only reads.
    unsafe { libc::futimens(lock.as_raw_fd(), times.as_ptr()) };
}

/// [`mark_writer_began`] for a writer that does not take the lock (a cold launch's draft of the
/// file at `path`): the lock is opened, and made with permission bits `mode` where there is
/// none, only to be marked.
pub(crate) fn mark_draft_began(path: &Path, mode: u32) {
    if let Ok(lock) = crate::side_file::open_lock(&lock_path(path), mode) {
        mark_writer_began(&lock);
    }
}

/// Whether a writer may have left a temporary or a draft beside the cache file at `path` since
/// it, or one of the `written` files beside it (its side files), was last written: the writer
/// lock's modification time ([`mark_writer_began`]) is later than the newest of their change
/// times. A reclaim read the directory before each of those writes (the save that put the file
/// in place, the launch that noted a reading in a side file), so what is left unread is what a
/// writer made after that, then left when it was killed. False where there is no file (the
/// launch that finds none packs, and its save reclaims) or no lock (no writer has made anything
/// beside it); true where a time cannot be read.
pub(crate) fn writer_began_since_written(path: &Path, written: &[PathBuf]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let changed = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
    let file = match std::fs::symlink_metadata(path) {
        Ok(file) => file,
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    let lock = match std::fs::symlink_metadata(lock_path(path)) {
        Ok(lock) => lock,
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    let newest = written
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| changed(&m))
        .fold(changed(&file), std::cmp::max);
    (lock.mtime(), lock.mtime_nsec()) > newest
}

/// Writes each kept entry (key, packed bytes, checksum, last use) to a temporary file next to
/// `path` (permission bits `mode`), makes it durable, maps it, and renames it over `path`.
/// Returns the map and each written entry's offset.
pub(crate) fn commit<'a>(
    storage: &dyn Storage,
    path: &Path,
    compat: &Compat,
    entries: impl Iterator<Item = (EntryKey, &'a [u8], u64, u64)>,
    sources: &[FileIdentity],
    mode: u32,
) -> Result<(MappedFile, Vec<FileEntry>), CacheError> {
    let result = (|| {
        let (staged, file) = Staged::create(storage, path, mode)?;
        let mut w = format::Writer::new(BufWriter::with_capacity(1 << 20, file), compat)?;
        let mut written = Vec::new();
        for (key, data, checksum, last_used) in entries {
            let offset = w.add(key, data, checksum, last_used)?;
            written.push(FileEntry {
                key,
                offset,
                size: data.len() as u64,
                checksum,
                last_used,
            });
        }
        let (buf, _) = w.finish(sources)?;
        let file = buf.into_inner().map_err(|e| e.into_error())?;
        // Map before the rename: what we map is what we wrote, whoever renames next.
        let map = staged.publish(file, |storage, temporary| storage.map(temporary))?;
        Ok((map, written))
    })();
    result.map_err(|e| io_error(path, e))
}

/// What a save left out of the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Saved {
    /// Entries whose packed bytes failed their checksum.
    pub corrupt: usize,
    /// Entries evicted to fit the budget.
    pub evicted: usize,
}

/// Saves every persistable entry (merged with entries other processes saved meanwhile), less
/// what `budget` evicts, then points unresolved entries at the new file so their heap copies
/// are freed. The file (and its lock, if new) gets permission bits `mode`. The state lock is
/// held only to take a snapshot and to re-point entries, not during I/O, so runtimes can be set
/// up and run while a save is in progress.
pub(crate) fn save(
    core: &CacheCore,
    storage: &dyn Storage,
    path: &Path,
    compat: &Compat,
    budget: CacheBudget,
    mode: u32,
) -> Result<Saved, CacheError> {
    let _lock = lock_writers(storage, path, mode)?;
    crate::publish::reclaim_abandoned(storage, path, true);
    // Constants lent to be kept are copied now, on the saver's thread, to be written below.
    core.keep_lent();

    // Snapshot: what this process knows, with bytes that stay valid without the lock.
    let (ours, repacked, mut sources, draft, layered) = {
        let mut state = core.state.lock();
        // What a read-only layer serves is never copied into this file (see `layers.rs`).
        let layered = state.layer_served_keys();
        // What XNNPACK packed into the draft is saved by completing it; what it packs from now
        // on goes into a new one.
        let draft = state.draft.take();
        let repacked: HashSet<_> = state
            .entries
            .iter()
            .filter(|e| e.packed_here)
            .filter_map(|e| e.key.map(|k| (k.kernel, k.bias, k.seed)))
            .collect();
        // Entries this process's runtimes looked up, in graph order: where they were first
        // found, or else where they were missed and packed; the rest (only loaded) after them.
        // (The rest as their files hold them: a file's entries are held in key order.)
        let mut in_order: Vec<&Entry> = state.entries.iter().collect();
        in_order.sort_by_key(|e| {
            let first = e.first_hit.or(e.first_miss).unwrap_or(u64::MAX);
            match e.location {
                Location::Mapped { map, offset } => (first, map, offset),
                Location::Heap(_) | Location::Drafted(_) => (first, usize::MAX, 0),
            }
        });
        let ours: Vec<Ours> = in_order
            .into_iter()
            .filter(|e| !e.layer && e.key.is_none_or(|k| !layered.contains(&k)))
            .filter_map(|e| {
                e.key.map(|key| Ours {
                    key,
                    source: state.source_of(e),
                    checksum: e.checksum,
                    used: e.hit || e.packed_here,
                    last_used: e.last_used,
                })
            })
            .collect();
        (ours, repacked, state.sources.clone(), draft, layered)
    };
    // Entries a repack in this process superseded: same weights, another seed, not used.
    let superseded = |k: &EntryKey, used: bool| {
        !used
            && repacked.iter().any(|(kernel, bias, seed)| {
                *kernel == k.kernel && *bias == k.bias && *seed != k.seed
            })
    };

    // What is on disk now (another process may have saved since we loaded).
    let disk = match storage.map(path) {
        Ok(map) => format::decode(map.bytes(), compat)
            .ok()
            .map(|d| (Arc::new(map), d)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(path, e)),
    };

    // This save's number: one more than any recorded, here or on disk.
    let this_save = 1 + ours
        .iter()
        .map(|o| o.last_used)
        .chain(
            disk.iter()
                .flat_map(|(_, d)| d.entries.iter().map(|e| e.last_used)),
        )
        .max()
        .unwrap_or(0);

    let mut rows: Vec<(FileEntry, Source)> = Vec::new();
    // Entries on disk that a layer serves are left out too.
    let mut known: HashSet<EntryKey> = layered;
    let mut saved = Saved::default();
    let row = |key, source: &Source, checksum, last_used| FileEntry {
        key,
        offset: 0,
        size: source.bytes().len() as u64,
        checksum,
        last_used,
    };
    for o in ours {
        if superseded(&o.key, o.used) {
            continue;
        }
        let sum = match (&o.source, o.checksum) {
            // Packed into the draft this save completes: summed when XNNPACK finished it, its
            // pages let go since (see `Space::settle`), and reading it again would map them back
            // while the launch may still be packing. An older draft is a published file now,
            // which another process may have cut short or damaged: read again, as mapped
            // entries are.
            (Source::Drafted(space, _), Some(sum))
                if draft.as_ref().is_some_and(|d| d.holds(space)) =>
            {
                sum
            }
            _ => checksum64(o.source.bytes()),
        };
        // A save passes over every mapped entry (here, and again as it writes it): the pages
        // it touched would otherwise stay resident for the life of the process, most of them
        // never used by a runtime.
        o.source.release_pages();
        // A mapped entry is copied only if its bytes still match what was recorded.
        if o.checksum.is_some_and(|c| c != sum) {
            saved.corrupt += 1;
            continue;
        }
        known.insert(o.key);
        let last_used = if o.used { this_save } else { o.last_used };
        rows.push((row(o.key, &o.source, sum, last_used), o.source));
    }
    if let Some((map, decoded)) = &disk {
        // Read front to back, and kept in that order.
        let mut by_offset: Vec<&FileEntry> = decoded.entries.iter().collect();
        by_offset.sort_by_key(|e| e.offset);
        for fe in by_offset {
            if known.contains(&fe.key) || superseded(&fe.key, false) {
                continue;
            }
            let source = Source::Mapped(map.clone(), fe.offset as usize, fe.size as usize);
            let sum = checksum64(source.bytes());
            source.release_pages();
            if sum != fe.checksum {
                saved.corrupt += 1;
                continue;
            }
            rows.push((*fe, source));
        }
    }
    if let Some((_, decoded)) = &disk {
        for s in &decoded.sources {
            if !sources.contains(s) {
                sources.push(*s);
            }
        }
    }
    let entries: Vec<FileEntry> = rows.iter().map(|(e, _)| *e).collect();
    let evictions = budget::plan(&entries, this_save, budget);
    saved.evicted = evictions.evicted.len();
    let evicted: HashSet<usize> = evictions.evicted.into_iter().collect();
    // Each mapped entry's pages go once the next is asked for (the writer has the bytes by
    // then), so the save holds one entry resident at a time.
    let mut last_asked: Option<&Source> = None;
    let mut kept = rows
        .iter()
        .enumerate()
        .filter(|(i, _)| !evicted.contains(i))
        .map(|(_, (e, source))| {
            if let Some(done) = last_asked.replace(source) {
                done.release_pages();
            }
            (e, source)
        });
    // The draft becomes the file, unless an entry packed into it is evicted (its bytes would
    // stay in the file, unnamed) or most of it is holes. Then the file is written anew, as
    // without a draft.
    let draft = draft.filter(|draft| {
        let kept_here = rows
            .iter()
            .enumerate()
            .filter(|(i, _)| !evicted.contains(i))
            .filter_map(|(_, (_, source))| {
                source.space().cloned().map(|s| (s, source.bytes().len()))
            });
        let (spaces, sizes): (Vec<_>, Vec<_>) = kept_here.unzip();
        !rows
            .iter()
            .enumerate()
            .any(|(i, (_, source))| evicted.contains(&i) && source.space().is_some())
            && !draft.mostly_holes(spaces.into_iter(), sizes.into_iter())
    });
    let written = match draft {
        Some(draft) => draft
            .publish(
                path,
                compat,
                kept.by_ref().map(|(e, source)| Row {
                    entry: *e,
                    space: source.space(),
                    bytes: source.bytes(),
                }),
                &sources,
            )
            .map_err(|e| io_error(path, e)),
        None => commit(
            storage,
            path,
            compat,
            kept.by_ref()
                .map(|(e, source)| (e.key, source.bytes(), e.checksum, e.last_used)),
            &sources,
            mode,
        ),
    };
    drop(kept);
    rows.iter().for_each(|(_, source)| source.release_pages());
    let (map, written) = written?;
    drop(rows);

    let mut state = core.state.lock();
    state.sources_unsaved = false;
    for s in sources {
        if !state.sources.contains(&s) {
            state.sources.push(s);
        }
    }
    let m = state.maps.len();
    state.maps.push(Arc::new(map));
    for fe in written {
        match state.by_key.get(&fe.key) {
            // The entry under this key now may not be the one written: while the save ran, the
            // one snapshotted may have been forgotten (the size XNNPACK read was another) and
            // its weight repacked. Only bytes of the entry's own size stand for it; a repacked
            // entry stays on the heap, unsaved, for the next save.
            Some(i) if state.entries[i].size as u64 == fe.size => {
                let e = &mut state.entries[i];
                e.unsaved = false;
                if matches!(e.location, Location::Drafted(_)) {
                    // Its pages are where it was packed, in a file that is published now (or
                    // about to be copied from, at the next save).
                    e.checksum = Some(fe.checksum);
                    e.checked = true;
                } else if !e.resolved {
                    // Nothing holds this address yet: read it from the file from now on,
                    // which frees the heap copy.
                    e.location = Location::Mapped {
                        map: m,
                        offset: fe.offset as usize,
                    };
                    e.checksum = Some(fe.checksum);
                }
                e.last_used = fe.last_used;
            }
            Some(_) => {}
            // Saved by another process: look-up-able here too.
            None => state.insert_mapped(m, &fe),
        }
    }
    Ok(saved)
}

/// An entry this process knows, as a save snapshots it.
struct Ours {
    key: EntryKey,
    source: Source,
    /// Recorded for an entry read from or written to a file.
    checksum: Option<u64>,
    /// Found or packed in this process.
    used: bool,
    last_used: u64,
}

/// What `verify_file` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    /// Length of the file in bytes, as it was read (before any rewrite).
    pub file_size: u64,
    /// Entries that passed decoding, including any whose packed bytes fail their checksum.
    pub entries: usize,
    /// Total size in bytes of those entries' packed regions.
    pub packed_bytes: u64,
    /// Of the entries, those that keep a constant's own bytes rather than packed weights (see
    /// [`KEPT_CONSTANT_SEED`](format::KEPT_CONSTANT_SEED)).
    pub kept_constants: usize,
    /// Entries dropped at decode (bad bounds, alignment, duplicates).
    pub invalid_entries: usize,
    /// Entries whose packed bytes do not match their checksum (only when checked).
    pub corrupt: Vec<format::FileEntry>,
    /// Whether the file was rewritten without the bad entries.
    pub rewritten: bool,
    /// The number of the last save that wrote the file (the largest last-use number in it).
    pub last_save: u64,
    /// Packed bytes of the entries the last save's process used.
    pub live_bytes: u64,
    /// Packed bytes of the others: used by earlier saves only (an older model, another
    /// process's).
    pub stale_bytes: u64,
    /// Packed bytes the next save would evict under the budget asked for, if its process used
    /// what the last one did.
    pub evictable_bytes: u64,
    /// Entries a compaction evicted to fit the budget.
    pub evicted: usize,
}

/// Reads a cache file as `compat` expects it; with `check_data`, checksums every entry; with
/// `rewrite`, replaces the file (under the writer lock) with only the good entries, tightly
/// packed, when anything was bad or a `compaction` budget is given; that budget also evicts
/// (the last save's entries are the live ones). `budget` is what the report's evictable bytes
/// are counted under. A rewrite keeps the file's permission bits (never wider).
pub(crate) fn inspect_file(
    storage: &dyn Storage,
    path: &Path,
    compat: &Compat,
    check_data: bool,
    rewrite: bool,
    budget: CacheBudget,
    compaction: bool,
) -> Result<Result<FileReport, FileError>, CacheError> {
    // What the file allows now is what its rewrite and a new lock get; 0600 if it cannot be
    // told (then the map below fails anyway).
    let mode = std::fs::metadata(path).map_or(crate::side_file::PRIVATE_MODE, |m| {
        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o666
    });
    let _lock = if rewrite {
        let lock = lock_writers(storage, path, mode)?;
        crate::publish::reclaim_abandoned(storage, path, true);
        Some(lock)
    } else {
        None
    };
    let map = storage.map(path).map_err(|e| io_error(path, e))?;
    let decoded = match format::decode(map.bytes(), compat) {
        Ok(d) => d,
        Err(e) => return Ok(Err(e)),
    };
    let data = |e: &FileEntry| &map.bytes()[e.offset as usize..(e.offset + e.size) as usize];
    let corrupt: Vec<FileEntry> = if check_data {
        // Read front to back.
        let mut by_offset: Vec<&FileEntry> = decoded.entries.iter().collect();
        by_offset.sort_by_key(|e| e.offset);
        by_offset
            .into_iter()
            .filter(|e| checksum64(data(e)) != e.checksum)
            .copied()
            .collect()
    } else {
        Vec::new()
    };
    let last_save = decoded
        .entries
        .iter()
        .map(|e| e.last_used)
        .max()
        .unwrap_or(0);
    let evictions = budget::plan(&decoded.entries, last_save, budget);
    let mut report = FileReport {
        last_save,
        live_bytes: evictions.live_bytes,
        stale_bytes: evictions.stale_bytes,
        evictable_bytes: evictions.evicted_bytes,
        file_size: map.bytes().len() as u64,
        entries: decoded.entries.len(),
        packed_bytes: decoded.entries.iter().map(|e| e.size).sum(),
        kept_constants: decoded
            .entries
            .iter()
            .filter(|e| e.key.keeps_constant())
            .count(),
        invalid_entries: decoded.dropped.len(),
        corrupt,
        rewritten: false,
        evicted: 0,
    };
    let anything_bad = !report.corrupt.is_empty() || report.invalid_entries > 0;
    if rewrite && (anything_bad || compaction) {
        let evicted: HashSet<usize> = if compaction {
            evictions.evicted.into_iter().collect()
        } else {
            HashSet::new()
        };
        let good = decoded
            .entries
            .iter()
            .enumerate()
            .filter(|(i, e)| !report.corrupt.contains(e) && !evicted.contains(i))
            .map(|(_, e)| (e.key, data(e), e.checksum, e.last_used));
        commit(storage, path, compat, good, &decoded.sources, mode)?;
        report.rewritten = true;
        report.evicted = evicted.len();
    }
    Ok(Ok(report))
}
