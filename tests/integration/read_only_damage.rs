//! Damage in a cache file that cannot be written (an app's read-only bundle) is served at most
//! once (issue 38): the launch that checks it remembers what it found under the user's state
//! directory, and every later launch forgets those entries before any look-up, reading nothing
//! to do so. With nowhere to remember, the file is checked before use.

use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::format::{self, Compat};
use xnnblob::cache::{CacheOptions, VerifyPacked};
use xnnblob::program::Program;

use super::lying_cache_files::chain;
use crate::common;

/// Makes the record of `file`'s damage under the state directory `state` a FIFO (where the
/// cache keeps it: `read-only-caches/`, named by the hash of the file's absolute path), so that
/// nothing can be remembered there; returns its path.
pub(crate) fn fifo_at_damage_record(state: &Path, file: &Path) -> PathBuf {
    let records = state.join("read-only-caches");
    std::fs::create_dir_all(&records).unwrap();
    let absolute = std::path::absolute(file).unwrap();
    let digest = xnnblob::sha256::sha256(absolute.as_os_str().as_encoded_bytes());
    let record = records.join(format!("{}.damage", xnnblob::sha256::to_hex(&digest[..16])));
    let made = std::process::Command::new("mkfifo")
        .arg(&record)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", record.display());
    record
}

struct Launch {
    output: Vec<f32>,
    note: Option<String>,
    checked: usize,
    packed: usize,
}

/// A launch that uses the file at `path` read-only, remembering under `state_dir`.
fn read_only_launch(pte: &Path, ptd: &Path, path: &Path, state_dir: PathBuf) -> Launch {
    let backend = Backend::new(BackendOptions {
        threads: 1,
        cache_options: CacheOptions {
            verify: VerifyPacked::Background,
            state_dir: Some(state_dir),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let cache = backend.file_cache(path).unwrap();
    cache.keep_read_only();
    let program = Program::load(
        &backend,
        pte,
        &[ptd.to_path_buf()],
        Some(&WeightsCacheChoice::File(path.to_path_buf())),
    )
    .unwrap();
    let mut method = program.method("forward").unwrap();
    let input: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    let output = method.execute_f32(&[&input]).unwrap().remove(0);
    cache.wait_saved().unwrap();
    let stats = cache.stats();
    Launch {
        output,
        note: cache.damage_note(),
        checked: stats.checked,
        packed: stats.packed,
    }
}

#[test]
fn damage_in_a_read_only_cache_is_served_at_most_once() {
    let dir = common::scratch("read-only-damage");
    let (pte, ptd) = chain(&dir, "chain", 0);
    let path = dir.join("bundle.xbc");
    let state = dir.join("state");
    // Packed once, as the app's build would ship it.
    let backend = Backend::new(BackendOptions::default()).unwrap();
    let program = Program::load(
        &backend,
        &pte,
        std::slice::from_ref(&ptd),
        Some(&WeightsCacheChoice::File(path.clone())),
    )
    .unwrap();
    let input: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    let right = program
        .method("forward")
        .unwrap()
        .execute_f32(&[&input])
        .unwrap()
        .remove(0);
    backend.file_cache(&path).unwrap().wait_saved().unwrap();
    drop((program, backend));
    // Bit rot in one entry's packed bytes.
    let mut bytes = std::fs::read(&path).unwrap();
    let compat = Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    };
    let entry = format::decode(&bytes, &compat).unwrap().entries[2];
    bytes[(entry.offset + entry.size / 2) as usize] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    // A record is made only of a file unchanged for a while (a change within one tick of the
    // file system's clock would not show): let it settle.
    std::thread::sleep(xnnblob::cache::SETTLED + std::time::Duration::from_millis(200));

    let first = read_only_launch(&pte, &ptd, &path, state.clone());
    let note = first.note.expect("the first launch says what it found");
    assert!(note.contains("after this launch used them"), "{note}");
    assert!(first.checked > 0, "the first launch checked the file");

    for launch in ["second", "third"] {
        let later = read_only_launch(&pte, &ptd, &path, state.clone());
        assert_eq!(
            later.output, right,
            "{launch}: the damage is not served again"
        );
        assert_eq!(
            later.checked, 0,
            "{launch}: nothing hashed: the record says"
        );
        assert_eq!(later.packed, 1, "{launch}: the damaged weight is repacked");
        let note = later.note.expect("each launch says so");
        assert!(note.contains("before use"), "{note}");
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is never written"
    );

    // With nowhere to remember, checked before use: right from the first launch.
    let nowhere = read_only_launch(&pte, &ptd, &path, PathBuf::from("/proc/no-such-dir"));
    assert_eq!(nowhere.output, right);
    assert!(nowhere.note.unwrap().contains("before use"));

    // A state directory whose record of this file is a FIFO: nothing can be remembered there,
    // so every launch checks before use, and no note says the damage is remembered.
    let fifo_state = dir.join("fifo-state");
    fifo_at_damage_record(&fifo_state, &path);
    for launch in ["first", "second"] {
        let with_fifo = read_only_launch(&pte, &ptd, &path, fifo_state.clone());
        assert_eq!(
            with_fifo.output, right,
            "{launch} launch with a FIFO record"
        );
        let note = with_fifo.note.unwrap();
        assert!(
            note.contains("before use") && !note.contains("is remembered"),
            "{note}"
        );
    }
}
