//! Packed bytes damaged inside a valid file: the XXH3 sum each region is checked against, the
//! checks that find damage (`verify`, before use, in the background, and the records that spare
//! a check of an unchanged file), and the repacking of what they find.

use super::{cold, default_compat, launch, model, reopen};
use crate::common::scratch;
use std::path::Path;
use xnnblob::cache::{CacheOptions, PackedWeightsCache, format, verify_file};
use xnnblob_test_support::synthetic::Mlp;

/// A cold launch, then one flipped bit inside the first packed region (a bad sector's worth):
/// the outputs and the file's size.
fn cold_then_damaged(path: &Path, mlp: &Mlp) -> (Vec<f32>, u64) {
    let (expected, size) = cold(path, mlp);
    let mut bytes = std::fs::read(path).unwrap();
    bytes[format::HEADER_SIZE + 100] ^= 0x10;
    std::fs::write(path, &bytes).unwrap();
    (expected, size)
}

#[test]
fn packed_regions_check_with_any_xxh3_implementation() {
    // The format promises XXH3-64 (seed 0) of each packed region: recompute it with the crate
    // directly, not through xnnblob's checksum module.
    let dir = scratch("xxh3");
    let path = dir.join("weights.xbc");
    cold(&path, &model());
    let bytes = std::fs::read(&path).unwrap();
    let decoded = format::decode(&bytes, &default_compat()).unwrap();
    assert!(!decoded.entries.is_empty());
    for e in &decoded.entries {
        let region = &bytes[e.offset as usize..(e.offset + e.size) as usize];
        assert_eq!(xxhash_rust::xxh3::xxh3_64(region), e.checksum);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_packed_data_is_reported_by_verify_and_repacked_next_launch() {
    let dir = scratch("data-flip");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (expected, size) = cold_then_damaged(&path, &mlp);

    let options = CacheOptions::default();
    let report = verify_file(&path, &options, true, false).unwrap().unwrap();
    assert_eq!(report.corrupt.len(), 1);
    assert_eq!(report.corrupt[0].offset, format::HEADER_SIZE as u64);
    assert!(!report.rewritten);
    // The in-process check finds it too.
    assert_eq!(reopen(&path).verify().len(), 1);

    let report = verify_file(&path, &options, true, true).unwrap().unwrap();
    assert!(report.rewritten);
    let cache = reopen(&path);
    assert_eq!(launch(&cache, &mlp), expected);
    assert_eq!(cache.stats().packed, 1, "the dropped entry is repacked");
    drop(cache);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    assert!(
        verify_file(&path, &options, true, false)
            .unwrap()
            .unwrap()
            .corrupt
            .is_empty()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_entry_is_never_used_when_checked_before_use() {
    let dir = scratch("verify-before-use");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (expected, size) = cold_then_damaged(&path, &mlp);

    let options = CacheOptions {
        verify: xnnblob::cache::VerifyPacked::BeforeUse,
        ..Default::default()
    };
    let cache = PackedWeightsCache::open_with(&path, options).unwrap();
    assert_eq!(cache.stats().corrupt_found, 1, "found at open");
    let out = launch(&cache, &mlp);
    assert_eq!(out, expected, "this very launch computes right");
    assert_eq!(cache.stats().packed, 1, "the damaged entry is repacked");
    drop(cache);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    assert!(
        verify_file(&path, &CacheOptions::default(), true, false)
            .unwrap()
            .unwrap()
            .corrupt
            .is_empty()
    );
}

#[test]
fn a_damaged_entry_found_in_the_background_is_repacked_by_the_next_launch() {
    let dir = scratch("verify-background");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (expected, _) = cold_then_damaged(&path, &mlp);

    let background = CacheOptions {
        verify: xnnblob::cache::VerifyPacked::Background,
        ..Default::default()
    };
    let cache = PackedWeightsCache::open_with(&path, background.clone()).unwrap();
    launch(&cache, &mlp);
    cache.wait_saved().unwrap();
    assert_eq!(cache.stats().corrupt_found, 1);
    drop(cache);
    let cache = PackedWeightsCache::open_with(&path, background).unwrap();
    assert_eq!(launch(&cache, &mlp), expected);
    assert_eq!(cache.stats().packed, 1, "repacked by the next launch");
    cache.wait_saved().unwrap();
    assert_eq!(cache.stats().corrupt_found, 0);
}

/// A background check of a file no write changed since its last one hashes nothing: the
/// check is recorded beside the file (`PATH.checked`), and a write to the file undoes the record.
#[test]
fn a_background_check_is_recorded_until_the_file_changes() {
    let dir = scratch("checked-record");
    let mlp = model();
    let background = CacheOptions {
        verify: xnnblob::cache::VerifyPacked::Background,
        ..Default::default()
    };
    let warm = |path: &Path| {
        let cache = PackedWeightsCache::open_with(path, background.clone()).unwrap();
        let out = launch(&cache, &mlp);
        cache.wait_saved().unwrap();
        (out, cache.stats())
    };
    let path = dir.join("weights.xbc");
    let (expected, _) = cold(&path, &mlp);
    // A file of the user's where the record would go is neither trusted nor replaced.
    let theirs = dir.join("theirs.xbc");
    cold(&theirs, &mlp);
    let notes = b"my notes\n";
    std::fs::write(dir.join("theirs.xbc.checked"), notes).unwrap();
    // A record is made only for a file unchanged for 2 s before its check.
    std::thread::sleep(std::time::Duration::from_millis(2300));

    let (out, s) = warm(&path);
    assert_eq!(out, expected);
    assert_eq!(
        (s.checked, s.corrupt_found),
        (3, 0),
        "every entry checked once"
    );
    assert!(dir.join("weights.xbc.checked").is_file());
    let (out, s) = warm(&path);
    assert_eq!(out, expected);
    assert_eq!(s.checked, 0, "recorded: nothing hashed");

    let (_, s) = warm(&theirs);
    assert_eq!(s.checked, 3);
    let (_, s) = warm(&theirs);
    assert_eq!(s.checked, 3, "no record where the user's file is");
    assert_eq!(
        std::fs::read(dir.join("theirs.xbc.checked")).unwrap(),
        notes
    );

    // A bad sector's worth of damage, written in place: the change time moves.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[format::HEADER_SIZE + 100] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let (_, s) = warm(&path);
    assert_eq!((s.checked, s.corrupt_found), (3, 1));
    let (out, s) = warm(&path);
    assert_eq!(out, expected, "the damaged weight was repacked");
    assert_eq!(s.packed, 1);
}

/// With background checks, the file a save writes is recorded as checked (every byte was
/// checked as it was written): the launches after a cold one hash nothing (issue 39: they hashed
/// every entry they used until a record was made, 5% of a 40-token run). A write to the file
/// still undoes the record.
#[test]
fn the_file_a_save_writes_needs_no_check_by_the_launches_after_it() {
    let dir = scratch("saved-is-checked");
    let mlp = model();
    let background = CacheOptions {
        verify: xnnblob::cache::VerifyPacked::Background,
        ..Default::default()
    };
    let launch_once = |path: &Path| {
        let cache = PackedWeightsCache::open_with(path, background.clone()).unwrap();
        let out = launch(&cache, &mlp);
        cache.wait_saved().unwrap();
        (out, cache.stats())
    };
    let path = dir.join("weights.xbc");
    let (expected, cold) = launch_once(&path);
    assert_eq!(cold.packed, 3);
    assert!(
        dir.join("weights.xbc.checked").is_file(),
        "recorded by the save"
    );
    for _ in 0..2 {
        let (out, warm) = launch_once(&path);
        assert_eq!(out, expected);
        assert_eq!(
            (warm.packed, warm.checked),
            (0, 0),
            "nothing packed, nothing hashed"
        );
    }
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[format::HEADER_SIZE + 100] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let (_, damaged) = launch_once(&path);
    assert_eq!(
        (damaged.checked, damaged.corrupt_found),
        (3, 1),
        "the write undid the record"
    );
}
