//! Read-only layers under a cache file: packed-weight caches made ahead of time for a class of
//! CPUs (`xnnblob prepack`, shipped in an app's bundle), consulted before the cache's own file.
//!
//! A look-up is served by the first layer that holds its key, then by the cache's own file;
//! only what none holds is packed, into the cache's own file, and a save never copies what a
//! layer serves. A layer is taken whole or not at all: its XNNPACK build must be this process's
//! and its CPU this CPU's packing class ([`CpuMatch::PackingClass`]), and a file that is not a
//! valid cache is ignored, each with one note saying why.
//!
//! A layer cannot be repaired, so its damage is handled as for any read-only cache file
//! (`PackedWeightsCache::keep_read_only`): what a check found is remembered under the user's
//! state directory, keyed by the layer's path, with the file's status (inode, size, change time);
//! a layer with a record has the damaged entries it names forgotten at open and nothing hashed.
//! One without is checked after the launch, in the background, and what is found is
//! recorded, so a damaged entry is served at most once. Where nothing could be recorded (no state
//! directory, a record path that cannot be written as a regular file, a layer changed within its
//! settle time), the layer is checked at open, before use.

use super::checked;
use super::core::{CacheCore, LayerDamage};
use super::format::{self, Compat, CpuMatch, FileError};
use crate::mmap::MappedFile;
use crate::storage::Storage;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file name ending of a cache file in a layer directory.
pub const CACHE_FILE_EXTENSION: &str = "xbc";

/// What became of one file given as a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerOutcome {
    /// Mapped, with this many entries that serve look-ups (those no earlier layer holds).
    Used {
        /// The layer file.
        path: PathBuf,
        /// Its entries.
        entries: usize,
    },
    /// Not used: made for another XNNPACK build or CPU class, or not a valid cache file.
    Ignored {
        /// The layer file.
        path: PathBuf,
        /// Why.
        why: FileError,
    },
    /// A directory none of whose cache files is for this CPU's class and XNNPACK build (a
    /// bundle made for other devices): said once for the directory, not once per file.
    NoneForThisCpu {
        /// The directory.
        dir: PathBuf,
        /// Its cache files, all made for other CPU classes or builds.
        files: usize,
    },
    /// More than one file of a directory that is not a usable cache (not valid, or not
    /// readable): said once for the directory, with the first of them, not once per file.
    UnusableInDirectory {
        /// The directory.
        dir: PathBuf,
        /// How many of its cache files were not usable.
        files: usize,
        /// What became of the first of them ([`LayerOutcome::Ignored`] or
        /// [`LayerOutcome::Unreadable`]).
        first: Box<LayerOutcome>,
    },
    /// Could not be read (missing, not a regular file, no permission).
    Unreadable {
        /// The file or directory given.
        path: PathBuf,
        /// The operating system's error, in words.
        error: String,
    },
}

impl LayerOutcome {
    /// The note a user reads once, for a layer that was not used.
    pub fn note(&self) -> Option<String> {
        match self {
            LayerOutcome::Used { .. } => None,
            LayerOutcome::Ignored { path, why } => Some(format!(
                "read-only packed-weight cache {} was ignored ({why}); what it holds is packed \
                 into the writable cache instead",
                path.display()
            )),
            LayerOutcome::NoneForThisCpu { dir, files } => Some(format!(
                "none of the {files} read-only packed-weight caches in {} is for this CPU's \
                 class (this CPU: {}); they are ignored and what they hold is packed into the \
                 writable cache instead",
                dir.display(),
                super::describe_cpu_fingerprint(super::cpu_fingerprint())
            )),
            LayerOutcome::UnusableInDirectory { dir, files, first } => Some(format!(
                "{files} files in read-only packed-weight cache directory {} are not usable \
                 caches and are ignored; the first: {}",
                dir.display(),
                first.note().unwrap_or_default()
            )),
            LayerOutcome::Unreadable { path, error } => Some(format!(
                "read-only packed-weight cache {} cannot be read ({error}); it is ignored",
                path.display()
            )),
        }
    }
}

/// A layer whose entries are still to be checked, after the launch, with where to remember
/// what the check finds.
pub(crate) struct PendingCheck {
    path: PathBuf,
    map: Arc<MappedFile>,
    index: usize,
    record: PathBuf,
}

/// The files `given` names, in order, each with the directory it was found in: a directory
/// stands for the cache files directly in it (`*.xbc`, by name), anything else for itself.
fn files_of(
    given: &[PathBuf],
    outcomes: &mut Vec<LayerOutcome>,
) -> Vec<(PathBuf, Option<PathBuf>)> {
    let mut files = Vec::new();
    for path in given {
        if !path.is_dir() {
            files.push((path.clone(), None));
            continue;
        }
        match std::fs::read_dir(path) {
            Ok(dir) => {
                let mut found: Vec<PathBuf> = dir
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == CACHE_FILE_EXTENSION))
                    .collect();
                found.sort();
                files.extend(found.into_iter().map(|f| (f, Some(path.clone()))));
            }
            Err(e) => outcomes.push(LayerOutcome::Unreadable {
                path: path.clone(),
                error: e.to_string(),
            }),
        }
    }
    files
}

/// Whether a file was refused for being made for other devices (its CPU class or XNNPACK
/// build), not for being damaged.
fn for_other_devices(why: &FileError) -> bool {
    matches!(
        why,
        FileError::CpuMismatch { .. } | FileError::BuildMismatch
    )
}

/// Replaces, for each directory with no file used, its files' outcomes of being for other
/// devices with one [`LayerOutcome::NoneForThisCpu`]; in a directory with one used, those of
/// the others are dropped (a bundle holds a file per class: the others are expected). A
/// directory's files that are not usable caches, when there is more than one, become one
/// [`LayerOutcome::UnusableInDirectory`]: a directory of thousands of junk files is one note.
fn grouped(outcomes: Vec<(LayerOutcome, Option<PathBuf>)>) -> Vec<LayerOutcome> {
    let unusable = |o: &LayerOutcome| match o {
        LayerOutcome::Ignored { why, .. } => !for_other_devices(why),
        LayerOutcome::Unreadable { .. } => true,
        _ => false,
    };
    let mut unusable_count: std::collections::HashMap<&PathBuf, usize> = Default::default();
    for (o, d) in &outcomes {
        if let (Some(d), true) = (d, unusable(o)) {
            *unusable_count.entry(d).or_default() += 1;
        }
    }
    let unusable_in = |dir: &PathBuf| unusable_count.get(dir).copied().unwrap_or(0);
    let used_in = |dir: &PathBuf| {
        outcomes
            .iter()
            .any(|(o, d)| d.as_ref() == Some(dir) && matches!(o, LayerOutcome::Used { .. }))
    };
    let mut said: Vec<PathBuf> = Vec::new();
    let mut said_unusable: Vec<PathBuf> = Vec::new();
    let mut kept = Vec::new();
    for (outcome, dir) in &outcomes {
        let other = matches!(outcome, LayerOutcome::Ignored { why, .. } if for_other_devices(why));
        match dir {
            Some(dir) if unusable(outcome) && unusable_in(dir) > 1 => {
                if !said_unusable.contains(dir) {
                    said_unusable.push(dir.clone());
                    kept.push(LayerOutcome::UnusableInDirectory {
                        dir: dir.clone(),
                        files: unusable_in(dir),
                        first: Box::new(outcome.clone()),
                    });
                }
            }
            Some(dir) if other => {
                if !used_in(dir) && !said.contains(dir) {
                    said.push(dir.clone());
                    let files = outcomes
                        .iter()
                        .filter(|(o, d)| {
                            d.as_ref() == Some(dir)
                                && matches!(o, LayerOutcome::Ignored { why, .. } if for_other_devices(why))
                        })
                        .count();
                    kept.push(LayerOutcome::NoneForThisCpu {
                        dir: dir.clone(),
                        files,
                    });
                }
            }
            _ => kept.push(outcome.clone()),
        }
    }
    kept
}

/// Maps each layer `given` names and adds the entries of those this process can use to `core`,
/// after the cache's own file (which must be loaded first). Returns what became of each file,
/// and the checks still to be made after the launch.
pub(crate) fn load(
    core: &CacheCore,
    storage: &dyn Storage,
    given: &[PathBuf],
    compat: &Compat,
    state_dir: Option<&Path>,
) -> (Vec<LayerOutcome>, Vec<PendingCheck>) {
    let mut unreadable_dirs = Vec::new();
    let files = files_of(given, &mut unreadable_dirs);
    let mut outcomes: Vec<(LayerOutcome, Option<PathBuf>)> =
        unreadable_dirs.into_iter().map(|o| (o, None)).collect();
    let mut pending = Vec::new();
    for (path, dir) in files {
        let unreadable =
            |path: PathBuf, error: String| (LayerOutcome::Unreadable { path, error }, dir.clone());
        // A FIFO or device given as a layer is never opened: opening one can block forever.
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                outcomes.push(unreadable(path, "not a regular file".into()));
                continue;
            }
            Err(e) => {
                outcomes.push(unreadable(path, e.to_string()));
                continue;
            }
        }
        let map = match storage.map(&path) {
            Ok(map) => Arc::new(map),
            Err(e) => {
                outcomes.push(unreadable(path, e.to_string()));
                continue;
            }
        };
        for range in format::metadata_ranges(map.bytes()) {
            crate::mmap::advise_read_soon(&map.bytes()[range]);
        }
        let decoded = match format::decode_matching(map.bytes(), compat, CpuMatch::PackingClass) {
            Ok(decoded) => decoded,
            Err(why) => {
                outcomes.push((LayerOutcome::Ignored { path, why }, dir));
                continue;
            }
        };
        let index = {
            let mut state = core.state.lock();
            let index = state.maps.len();
            state.maps.push(map.clone());
            state.layer_files.insert(index, path.clone());
            for e in &decoded.entries {
                state.insert_layer_entry(index, e);
            }
            index
        };
        let found_before_use = |damaged: usize| {
            if damaged > 0 {
                core.state.lock().layer_damage.push(LayerDamage {
                    path: path.clone(),
                    entries: damaged,
                    after_use: false,
                    remembered: false,
                });
            }
        };
        match checked::elsewhere_path(&path, state_dir) {
            Some(record) => match checked::remembered_damage(&record, &path, &map) {
                Some(damaged) => found_before_use(core.settle_layer(index, &damaged)),
                None if checked::can_remember(&record, &path, &map) => pending.push(PendingCheck {
                    path: path.clone(),
                    map,
                    index,
                    record,
                }),
                // What a check after the launch found could not be remembered: checked now,
                // before any look-up, so damage is never served.
                None => found_before_use(core.forget_corrupt_in_layer(index).len()),
            },
            // Nowhere to remember a check: checked now, before any look-up.
            None => found_before_use(core.forget_corrupt_in_layer(index).len()),
        }
        outcomes.push((
            LayerOutcome::Used {
                path,
                entries: decoded.entries.len(),
            },
            dir,
        ));
    }
    (grouped(outcomes), pending)
}

/// Checks each pending layer's entries against their checksums, forgets the damaged ones (later
/// runtimes of this process pack them into the writable cache) and remembers what was found;
/// returns how many were damaged.
pub(crate) fn check(core: &CacheCore, pending: Vec<PendingCheck>) -> usize {
    let mut damaged = 0;
    for layer in pending {
        let before = checked::before_check(&layer.path, &layer.map);
        let found = core.forget_corrupt_in_layer(layer.index);
        damaged += found.len();
        let remembered = before.is_some_and(|before| {
            checked::remember_damage(&layer.record, &layer.path, &layer.map, before, &found)
        });
        if !found.is_empty() {
            core.state.lock().layer_damage.push(LayerDamage {
                path: layer.path.clone(),
                entries: found.len(),
                after_use: true,
                remembered,
            });
        }
    }
    damaged
}
