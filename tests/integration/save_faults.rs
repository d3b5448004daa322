//! A packed-weight cache save under every failure of every call it makes, through the fault
//! injector (`xnnblob_test_support::faults`): an error (EIO, ENOSPC), a kill, a power cut after the
//! call, a torn write. Each test first runs the save without a fault to list its calls, then
//! once per call with the fault there. After each:
//!
//! - the file at the path is the old one, byte for byte, or the new one, complete (every entry of
//!   both models, each checksum right);
//! - the launch whose save failed still gave the right outputs;
//! - the next launch (real storage) gives outputs bit-identical to a run without a cache, for
//!   both models, and leaves no temporary behind;
//! - nothing else in the directory changed.

use crate::common;

use common::scratch;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xnnblob::cache::{CacheError, CacheOptions, HeapFirst, PackedWeightsCache, verify_file};
use xnnblob::storage::SharedStorage;
use xnnblob::xnn::Runtime;
use xnnblob_test_support::faults::{Call, Fault, FaultyStorage};
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

/// The model already in the file before the faulty save.
fn old_model() -> Mlp {
    Mlp::random(&[64, 96, 32], 3)
}

/// The model the faulty launch packs: one layer of 1 MiB so the save writes in several calls.
fn new_model() -> Mlp {
    Mlp::random(&[64, 512, 512, 16], 4)
}

/// Entries of each model in the file: one per layer (its weights and bias packed together).
fn entries_of(mlp: &Mlp) -> usize {
    mlp.layers.len()
}

fn input_for(mlp: &Mlp) -> Vec<f32> {
    (0..mlp.input_width())
        .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
        .collect()
}

/// A model load through `cache`: registers the weights, creates a runtime, finalizes (with a
/// blocking save, that is the save), runs once. The outputs, and what finalize said.
fn launch(cache: &PackedWeightsCache, mlp: &Mlp) -> (Vec<f32>, Result<(), CacheError>) {
    let registrations = common::register_mlps(cache, &[mlp]);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(cache)).unwrap();
    drop(registrations);
    let saved = cache.finalize();
    let input = input_for(mlp);
    let mut out = vec![f32::NAN; mlp.output_width()];
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    (out, saved)
}

/// Outputs without any cache file.
fn uncached(mlp: &Mlp) -> Vec<f32> {
    launch(&PackedWeightsCache::in_memory(), mlp).0
}

/// The id of a process that has exited: temporaries named with it are a dead writer's.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A directory with the old model's cache file and a bystander file.
struct Before {
    dir: common::Scratch,
    path: PathBuf,
    old_bytes: Vec<u8>,
    bystander: PathBuf,
}

fn before(name: &str) -> Before {
    let dir = scratch(name);
    let path = dir.join("weights.xbc");
    let cache = PackedWeightsCache::open_with(
        &path,
        CacheOptions {
            blocking_save: true,
            ..Default::default()
        },
    )
    .unwrap();
    launch(&cache, &old_model()).1.unwrap();
    drop(cache);
    let bystander = dir.join("model.ptd");
    std::fs::write(&bystander, b"not the cache's to touch").unwrap();
    let old_bytes = std::fs::read(&path).unwrap();
    // A later launch comes a clock tick (up to 10 ms) after the save that made its file at
    // least: a writer's mark in the same tick as the file's change is not later than it, and
    // what that writer leaves waits for the next save (`side_files.rs`).
    std::thread::sleep(std::time::Duration::from_millis(12));
    Before {
        dir,
        path,
        old_bytes,
        bystander,
    }
}

/// What one faulty launch left, and what its save said.
struct Faulty {
    calls: Vec<Call>,
    saved: Result<(), CacheError>,
    gone: bool,
}

/// A launch of the new model whose every file operation goes through `fault`, playing a
/// process that has died by the end (a dead pid names its temporaries).
fn faulty_launch(b: &Before, fault: Fault) -> Faulty {
    let storage = Arc::new(FaultyStorage::new(fault).with_process_id(dead_pid()));
    let options = CacheOptions {
        blocking_save: true,
        storage: SharedStorage::new(storage.clone()),
        // Packed into a draft of the file, as a model past its first 4 MiB is: the faults
        // reach the draft's creation and allocation too.
        heap_first: HeapFirst(0),
        ..Default::default()
    };
    let saved = match PackedWeightsCache::open_with(&b.path, options) {
        Ok(cache) => {
            let (out, saved) = launch(&cache, &new_model());
            assert_eq!(out, uncached(&new_model()), "{fault:?}: the launch itself");
            drop(cache);
            saved
        }
        Err(e) => Err(e),
    };
    Faulty {
        calls: storage.calls(),
        saved,
        gone: storage.is_gone(),
    }
}

/// Checks the properties in this file's header after `fault`; returns whether the file was
/// replaced.
fn check_after(b: &Before, fault: Fault) -> bool {
    let bytes = std::fs::read(&b.path).expect("the cache file is never lost");
    let replaced = bytes != b.old_bytes;
    if replaced {
        let report = verify_file(&b.path, &CacheOptions::default(), true, false)
            .unwrap()
            .unwrap_or_else(|e| panic!("{fault:?}: a replaced file is a valid one: {e}"));
        assert!(report.corrupt.is_empty(), "{fault:?}: {report:?}");
        assert_eq!(report.invalid_entries, 0, "{fault:?}");
        assert_eq!(
            report.entries,
            entries_of(&old_model()) + entries_of(&new_model()),
            "{fault:?}: the new file has every entry"
        );
    }
    assert_eq!(
        std::fs::read(&b.bystander).unwrap(),
        b"not the cache's to touch"
    );

    // The next launch, a real process: right outputs, warm where the file had the entries.
    let next = PackedWeightsCache::open_with(
        &b.path,
        CacheOptions {
            blocking_save: true,
            ..Default::default()
        },
    )
    .unwrap();
    for mlp in [old_model(), new_model()] {
        let (out, saved) = launch(&next, &mlp);
        saved.unwrap();
        assert_eq!(out, uncached(&mlp), "{fault:?}: outputs after the fault");
    }
    let repacked = if replaced {
        0
    } else {
        entries_of(&new_model())
    };
    assert_eq!(next.stats().packed, repacked, "{fault:?}");
    drop(next);
    assert_eq!(
        listing(&b.dir),
        ["model.ptd", "weights.xbc", "weights.xbc.lock"],
        "{fault:?}: nothing left behind"
    );
    let report = verify_file(&b.path, &CacheOptions::default(), true, false)
        .unwrap()
        .unwrap();
    assert_eq!(
        report.entries,
        entries_of(&old_model()) + entries_of(&new_model()),
        "{fault:?}: 1x after the next launch"
    );
    replaced
}

/// The calls of a save without a fault.
fn calls_of_a_save() -> Vec<Call> {
    let b = before("save-calls");
    let run = faulty_launch(&b, Fault::None);
    run.saved.unwrap();
    assert!(check_after(&b, Fault::None));
    run.calls
}

/// Runs `fault_at(call)` for each call index `at` that `which` selects; returns how many runs
/// kept the old file and how many replaced it.
fn at_every(
    name: &str,
    which: impl Fn(&Call) -> bool,
    fault_at: impl Fn(usize) -> Fault,
) -> (usize, usize) {
    let calls = calls_of_a_save();
    let (mut kept, mut replaced) = (0, 0);
    for (at, call) in calls.iter().enumerate().filter(|(_, c)| which(c)) {
        let b = before(name);
        let fault = fault_at(at);
        let run = faulty_launch(&b, fault);
        assert_eq!(
            std::mem::discriminant(&run.calls[at]),
            std::mem::discriminant(call),
            "{fault:?}: the same calls as without it"
        );
        if check_after(&b, fault) {
            replaced += 1;
        } else {
            kept += 1;
        }
        // A save that stopped before its rename reported it (the launch itself still ran).
        let renamed = run.calls[..at].iter().any(|c| matches!(c, Call::Rename(_)));
        // A failure while packing into the draft of the file (before the save takes the
        // writer lock) only sends packing to memory: the save still completes.
        let packing = !run.calls[..at].contains(&Call::Lock)
            && match &run.calls[at] {
                Call::Allocate(_) => true,
                Call::Create(p) => p.to_string_lossy().contains("xnnblob-draft"),
                _ => false,
            };
        // A disk that fills up after every block of the file was allocated (at the draft's
        // final cut, which frees space) fails nothing.
        let missed = matches!(fault, Fault::FullFromCall { .. })
            && !run.calls[at..]
                .iter()
                .any(|c| matches!(c, Call::Write(_) | Call::Allocate(_) | Call::Create(_)));
        if missed {
            assert!(run.saved.is_ok(), "{fault:?}: nothing failed");
        } else if packing && !run.gone && !matches!(fault, Fault::FullFromCall { .. }) {
            assert!(run.saved.is_ok(), "{fault:?}: packed on the heap instead");
        } else if !renamed && !run.gone {
            assert!(run.saved.is_err(), "{fault:?}: the failure is reported");
        }
    }
    eprintln!("{name}: {kept} kept the old file, {replaced} replaced it");
    assert!(kept + replaced > 0);
    (kept, replaced)
}

fn any(_: &Call) -> bool {
    true
}

/// A call that changes a file's bytes or length: a write, or the allocation and final cut of
/// the draft that packing writes into through a map.
fn is_write(c: &Call) -> bool {
    matches!(c, Call::Write(_) | Call::Allocate(_) | Call::SetLen(_))
}

#[test]
fn a_save_syncs_its_file_before_the_rename_and_the_directory_after() {
    let calls = calls_of_a_save();
    let rename = calls
        .iter()
        .position(|c| matches!(c, Call::Rename(to) if to.ends_with("weights.xbc")))
        .expect("a rename over the cache file");
    let last_write = calls.iter().rposition(is_write).unwrap();
    let sync = calls.iter().rposition(|c| *c == Call::Sync).unwrap();
    assert!(last_write < sync && sync < rename, "{calls:?}");
    assert_eq!(calls.last(), Some(&Call::SyncDirectory), "{calls:?}");
    // Packed straight into a draft of the file, which the save completes and publishes.
    assert!(
        calls.iter().any(|c| matches!(c, Call::Allocate(_)))
            && calls.iter().any(|c| matches!(c, Call::SetLen(_))),
        "{calls:?}"
    );
}

#[test]
fn save_survives_eio_at_every_call() {
    at_every("eio", any, |call| Fault::FailCall {
        call,
        errno: libc::EIO,
    });
}

#[test]
fn save_survives_enospc_at_every_write() {
    // One write fails; the save reports it, and the retry when the cache closes may succeed.
    at_every("enospc", is_write, |call| Fault::FailCall {
        call,
        errno: libc::ENOSPC,
    });
}

#[test]
fn save_survives_a_disk_that_fills_up_at_every_write() {
    let (kept, replaced) = at_every("full", is_write, |call| Fault::FullFromCall { call });
    // Only a save whose file was allocated whole before the disk filled completes (`at_every`
    // checks which).
    assert!(kept > 0 && replaced <= 1, "{kept} {replaced}");
}

#[test]
fn save_survives_a_kill_before_every_call() {
    let (kept, replaced) = at_every("kill", any, |call| Fault::KillBeforeCall { call });
    assert!(
        kept > 0 && replaced > 0,
        "killed after the rename: the new file"
    );
}

#[test]
fn save_survives_a_power_cut_after_every_call() {
    let (kept, replaced) = at_every("power", any, |call| Fault::PowerCutAfterCall { call });
    assert!(kept > 0 && replaced > 0);
}

#[test]
fn save_survives_a_torn_write_at_every_write() {
    let (kept, _) = at_every("torn", is_write, |call| Fault::TornWrite { call });
    assert!(kept > 0);
}

#[test]
fn a_save_that_skips_its_fsync_is_caught_by_the_power_cut() {
    // The injector must be able to tell: a file renamed into place without its data synced
    // loses the data at a power cut. Played here by hand with the injector's own calls.
    use std::io::Write;
    use xnnblob::storage::Storage;
    let dir = scratch("no-fsync");
    let path = dir.join("data");
    let temporary = dir.join(".data.tmp");
    let storage = FaultyStorage::new(Fault::PowerCutAfterCall { call: 3 });
    let mut file = storage.create_new(&temporary, 0o600).unwrap();
    file.write_all(b"never synced").unwrap();
    drop(file);
    storage.rename(&temporary, &path).unwrap();
    storage.sync_directory(&dir).unwrap();
    assert!(storage.is_gone());
    assert!(storage.map(&path).is_err(), "nothing runs after the cut");
    // The bytes are lost with the process (the storage).
    drop(storage);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"",
        "unsynced bytes are lost"
    );
}

#[test]
fn compaction_survives_a_power_cut_or_kill_at_every_call() {
    use xnnblob::cache::compact_file;
    let compact = |b: &Before, fault: Fault| {
        let storage = Arc::new(FaultyStorage::new(fault).with_process_id(dead_pid()));
        let options = CacheOptions {
            storage: SharedStorage::new(storage.clone()),
            ..Default::default()
        };
        let result = compact_file(&b.path, &options);
        (storage.calls(), result.is_ok())
    };
    let (calls, ok) = compact(&before("compact-calls"), Fault::None);
    assert!(ok && calls.iter().any(|c| matches!(c, Call::Rename(_))));
    for at in 0..calls.len() {
        for fault in [
            Fault::KillBeforeCall { call: at },
            Fault::PowerCutAfterCall { call: at },
            Fault::FullFromCall { call: at },
        ] {
            let b = before("compact");
            compact(&b, fault);
            let bytes = std::fs::read(&b.path).expect("the cache file is never lost");
            let report = verify_file(&b.path, &CacheOptions::default(), true, false)
                .unwrap()
                .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
            assert!(report.corrupt.is_empty() && report.invalid_entries == 0);
            assert_eq!(report.entries, entries_of(&old_model()), "{fault:?}");
            assert!(bytes == b.old_bytes || report.file_size <= b.old_bytes.len() as u64);
            let next = PackedWeightsCache::open(&b.path).unwrap();
            let (out, _) = launch(&next, &old_model());
            assert_eq!(next.stats().packed, 0, "{fault:?}: still warm");
            assert_eq!(out, uncached(&old_model()));
            drop(next);
            assert_eq!(
                listing(&b.dir),
                ["model.ptd", "weights.xbc", "weights.xbc.lock"],
                "{fault:?}"
            );
        }
    }
}

/// A file system that cannot allocate ahead (`fallocate` fails with EOPNOTSUPP) is asked once:
/// the weight in hand and every later one are packed on the heap, and the save writes the file
/// as without a draft. Nothing is lost: the next launch finds every entry.
#[test]
fn a_file_system_that_cannot_allocate_ahead_is_asked_once() {
    let calls = calls_of_a_save();
    let at = calls
        .iter()
        .position(|c| matches!(c, Call::Allocate(_)))
        .expect("packing allocates the draft");
    let b = before("no-fallocate");
    let run = faulty_launch(
        &b,
        Fault::FailCall {
            call: at,
            errno: libc::EOPNOTSUPP,
        },
    );
    run.saved.unwrap();
    let after = &run.calls[at + 1..];
    assert!(
        !after.iter().any(|c| matches!(c, Call::Allocate(_))),
        "asked again: {after:?}"
    );
    assert!(
        after.iter().any(|c| matches!(c, Call::Write(_))),
        "{after:?}"
    );
    assert!(check_after(&b, Fault::None), "the file was saved whole");
}
