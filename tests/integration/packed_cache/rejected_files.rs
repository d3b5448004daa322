//! Files a launch does not use as they are: written by another XNNPACK build, CPU or format
//! version, torn, or with flipped bits in the header, index or trailer (rejected, rebuilt, back
//! to 1x), with an entry of another seed (that entry repacked in its place), or no cache at all
//! (left alone).

use super::{assert_matches_reference, cold, default_compat, launch, model, reopen};
use crate::common::scratch;
use std::path::Path;
use xnnblob::cache::{BlobId, CacheError, CacheOptions, LoadOutcome, PackedWeightsCache, format};
use xnnblob_test_support::synthetic::Mlp;

/// Writes a cache file as another build/CPU would, then checks a normal launch rejects it,
/// repacks everything, and leaves a file the next launch uses fully.
fn stale_file_is_rebuilt(name: &str, options: CacheOptions, expect: fn(&LoadOutcome) -> bool) {
    let dir = scratch(name);
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (_, fresh_size) = cold(&dir.join("reference.xbc"), &mlp);
    let other = PackedWeightsCache::open_with(&path, options).unwrap();
    launch(&other, &mlp);
    drop(other);

    let cache = reopen(&path);
    assert!(expect(cache.load_outcome()), "{:?}", cache.load_outcome());
    let out = launch(&cache, &mlp);
    assert_eq!(cache.stats().packed, 3);
    assert_matches_reference(&mlp, &out);
    drop(cache);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        fresh_size,
        "back to 1x"
    );
    let cache = reopen(&path);
    launch(&cache, &mlp);
    assert_eq!(cache.stats().packed, 0, "fully warm again");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn issue_22183_another_xnnpack_build_forces_a_rebuild_that_converges() {
    stale_file_is_rebuilt(
        "build",
        CacheOptions {
            build_id: Some(b"another xnnpack build".to_vec()),
            ..Default::default()
        },
        |o| matches!(o, LoadOutcome::Rejected(format::FileError::BuildMismatch)),
    );
}

#[test]
fn another_cpu_fingerprint_forces_a_rebuild() {
    stale_file_is_rebuilt(
        "cpu",
        CacheOptions {
            cpu_fingerprint: Some(0x1234),
            ..Default::default()
        },
        |o| {
            matches!(
                o,
                LoadOutcome::Rejected(format::FileError::CpuMismatch { .. })
            )
        },
    );
}

#[test]
fn another_format_version_forces_a_rebuild() {
    // Version 1 (the hand-made checksum), 2 (no last use), 4 (kept constants under another
    // key) and a future version alike.
    for version in [1, 2, 4, format::FORMAT_VERSION + 1] {
        let dir = scratch(&format!("version{version}"));
        let path = dir.join("weights.xbc");
        let mlp = model();
        let (_, size) = cold(&path, &mlp);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let cache = reopen(&path);
        assert!(matches!(
            cache.load_outcome(),
            LoadOutcome::Rejected(format::FileError::UnsupportedVersion { found }) if *found == version
        ));
        launch(&cache, &mlp);
        assert_eq!(cache.stats().packed, 3);
        drop(cache);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Rewrites the file's index with `edit` applied to each entry (checksums kept valid).
fn edit_index(path: &Path, edit: impl Fn(&mut format::FileEntry)) {
    let mut bytes = std::fs::read(path).unwrap();
    let decoded = format::decode(&bytes, &default_compat()).unwrap();
    let at = format::index_offset(&bytes).unwrap();
    let mut entries = decoded.entries.clone();
    entries.sort_by_key(|e| e.offset);
    entries.iter_mut().for_each(edit);
    bytes.truncate(at as usize);
    bytes.extend_from_slice(&format::encode_index(&entries, &decoded.sources, at));
    std::fs::write(path, &bytes).unwrap();
}

/// The file's entries by position: which weight each is (kernel and bias identities).
fn weights_in_file_order(path: &Path) -> Vec<(BlobId, BlobId)> {
    let decoded = format::decode(&std::fs::read(path).unwrap(), &default_compat()).unwrap();
    let mut entries = decoded.entries;
    entries.sort_by_key(|e| e.offset);
    entries.iter().map(|e| (e.key.kernel, e.key.bias)).collect()
}

#[test]
fn a_changed_seed_repacks_that_entry_and_the_file_returns_to_1x() {
    let dir = scratch("seed");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (_, size) = cold(&path, &mlp);
    let order = weights_in_file_order(&path);
    edit_index(&path, |e| {
        if e.offset == format::HEADER_SIZE as u64 {
            e.key.seed ^= 0x5A5A;
        }
    });
    let cache = reopen(&path);
    launch(&cache, &mlp);
    assert_eq!(cache.stats().packed, 1, "only the entry with the old seed");
    drop(cache);
    // The repacked weight keeps its place (graph order): a first inference still reads the
    // file front to back, and the regions pad to the same size whatever their lengths.
    assert_eq!(weights_in_file_order(&path), order, "graph order kept");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        size,
        "garbage reclaimed"
    );
    let cache = reopen(&path);
    launch(&cache, &mlp);
    assert_eq!(cache.stats().packed, 0, "fully warm");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Loads whatever is at `path`, checks the outputs and that the file is valid afterwards.
fn survives(path: &Path, mlp: &Mlp, expected: &[f32], what: &str) -> LoadOutcome {
    let cache = reopen(path);
    let outcome = cache.load_outcome().clone();
    let out = launch(&cache, mlp);
    assert_eq!(out, expected, "{what}");
    drop(cache);
    let decoded = format::decode(&std::fs::read(path).unwrap(), &default_compat());
    assert_eq!(
        decoded.map(|d| d.entries.len()).ok(),
        Some(3),
        "{what}: valid file after"
    );
    outcome
}

#[test]
fn torn_files_are_rebuilt_whatever_the_cut() {
    let dir = scratch("torn");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (expected, _) = cold(&path, &mlp);
    let good = std::fs::read(&path).unwrap();
    let index = format::index_offset(&good).unwrap() as usize;
    let len = good.len();
    let mut cuts: Vec<usize> = (0..=3).map(|i| index + i * format::ENTRY_SIZE).collect();
    cuts.extend([
        0,
        8,
        64,
        127,
        128,
        129,
        index - 1,
        len - 32,
        len - 24,
        len - 16,
        len - 8,
        len - 1,
    ]);
    for cut in cuts {
        std::fs::write(&path, &good[..cut]).unwrap();
        let outcome = survives(&path, &mlp, &expected, &format!("cut at {cut}"));
        assert!(
            matches!(outcome, LoadOutcome::Rejected(_)),
            "cut at {cut}: {outcome:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flipped_bits_in_header_index_or_trailer_are_detected() {
    let dir = scratch("flips");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (expected, _) = cold(&path, &mlp);
    let good = std::fs::read(&path).unwrap();
    let index = format::index_offset(&good).unwrap() as usize;
    // A flip in the magic's first 7 bytes makes the file no cache at all: it is left alone.
    for at in 0..7 {
        let mut bad = good.clone();
        bad[at] ^= 1 << (at % 8);
        std::fs::write(&path, &bad).unwrap();
        let refused = PackedWeightsCache::open(&path);
        assert!(
            matches!(refused, Err(CacheError::NotACacheFile { .. })),
            "flip at {at}: {:?}",
            refused.map(|_| ())
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bad,
            "flip at {at}: the file is untouched"
        );
    }
    let mut positions: Vec<usize> = (7..format::HEADER_SIZE).collect();
    positions.extend((index..good.len()).step_by(5));
    for at in positions {
        let mut bad = good.clone();
        bad[at] ^= 1 << (at % 8);
        std::fs::write(&path, &bad).unwrap();
        let outcome = survives(&path, &mlp, &expected, &format!("flip at {at}"));
        assert!(
            matches!(outcome, LoadOutcome::Rejected(_)),
            "flip at {at}: {outcome:?}"
        );
    }
    // A garbage trailer.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 32..].copy_from_slice(&[0xA5; 32]);
    std::fs::write(&path, &bad).unwrap();
    let outcome = survives(&path, &mlp, &expected, "garbage trailer");
    assert!(matches!(
        outcome,
        LoadOutcome::Rejected(format::FileError::BadTrailer)
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_is_not_a_cache_is_never_read_nor_replaced() {
    let dir = scratch("foreign");
    let notes = dir.join("notes.txt");
    let text = b"my notes, not a cache\n".to_vec();
    std::fs::write(&notes, &text).unwrap();
    // A program's own weights at the cache path (`--data X.ptd --cache X.ptd`).
    let ptd = dir.join("weights.ptd");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/mlp_xnn_external.ptd");
    std::fs::copy(&fixture, &ptd).unwrap();
    let ptd_bytes = std::fs::read(&ptd).unwrap();
    for (path, bytes) in [(&notes, &text), (&ptd, &ptd_bytes)] {
        let opened = PackedWeightsCache::open(path);
        assert!(
            matches!(&opened, Err(CacheError::NotACacheFile { .. })),
            "{}: {:?}",
            path.display(),
            opened.map(|_| ())
        );
        let why = PackedWeightsCache::check_path(path)
            .unwrap_err()
            .to_string();
        assert!(why.contains("not a packed-weight cache"), "{why}");
        assert_eq!(
            &std::fs::read(path).unwrap(),
            bytes,
            "{}: untouched",
            path.display()
        );
    }
    // Empty, or cut inside the magic by a torn write: a cache to rebuild.
    let empty = dir.join("empty.xbc");
    std::fs::write(&empty, b"").unwrap();
    PackedWeightsCache::check_path(&empty).unwrap();
    let torn = dir.join("torn.xbc");
    std::fs::write(&torn, &format::MAGIC[..5]).unwrap();
    PackedWeightsCache::check_path(&torn).unwrap();
}
