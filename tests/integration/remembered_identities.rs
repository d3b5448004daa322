//! Issue 61: a delegate's constant identities are kept in the cache file with its weights, and
//! a warm launch reads them back instead of describing every constant again. The record is
//! never trusted for more than it is: one that does not read as a record is ignored (the
//! identities are described again, every weight still found), and one that lies about which
//! weight is which finds another weight's entry only where that entry's size fits, as a lying
//! index does: the launch computes right and repacks.

use crate::common;
use crate::lying_cache_files::chain;
use std::path::{Path, PathBuf};
use xnnblob::cache::CacheStats;
use xnnblob::cache::format::{self, Compat};

/// The record's first bytes (`src/delegate/remembered.rs`); the payload's length and the
/// payload follow, then the records.
const RECORD_MAGIC: &[u8] = b"XBIDS\0\0\x02";

/// One launch of `pte` with the cache file `cache`, if any: its output, and what the cache did.
fn launch(pte: &Path, ptd: &Path, cache: Option<&Path>) -> (Vec<f32>, Option<CacheStats>) {
    let launched = crate::lying_cache_files::launch(pte, ptd, cache);
    (launched.output, launched.stats)
}

fn compat() -> Compat {
    Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    }
}

/// Edits the record's bytes in the file at `path` with `edit` (given the records after the
/// magic and the payload), then recomputes every checksum: consistent, and lying. Returns
/// whether the file holds a record.
fn craft_record(path: &Path, edit: impl FnOnce(&mut [u8])) -> bool {
    edit_record(path, edit, true)
}

/// As [`craft_record`], with the checksums recomputed or left as they were (damage).
fn edit_record(path: &Path, edit: impl FnOnce(&mut [u8]), recompute: bool) -> bool {
    edit_record_part(path, |_payload, records| edit(records), recompute)
}

/// Flips a byte of the payload the record holds, in the file at `path`, with every checksum
/// recomputed: a record made for another payload of the same length. Returns whether the file
/// holds a record.
fn craft_payload_copy(path: &Path) -> bool {
    edit_record_part(path, |payload, _| payload[8] ^= 0x01, true)
}

/// Edits the record in the file at `path` with `edit`, given the payload it holds and its
/// records, then recomputes every checksum or leaves them as they were. Returns whether the
/// file holds a record.
fn edit_record_part(path: &Path, edit: impl FnOnce(&mut [u8], &mut [u8]), recompute: bool) -> bool {
    let mut bytes = std::fs::read(path).unwrap();
    let decoded = format::decode(&bytes, &compat()).unwrap();
    let Some(record) = decoded.entries.iter().find(|e| {
        let (at, len) = (e.offset as usize, e.size as usize);
        e.key.keeps_constant() && bytes[at..at + len].starts_with(RECORD_MAGIC)
    }) else {
        return false;
    };
    let (at, len) = (record.offset as usize, record.size as usize);
    let payload_at = at + RECORD_MAGIC.len() + 8;
    let payload_len = u64::from_le_bytes(bytes[payload_at - 8..payload_at].try_into().unwrap());
    let (payload, records) = bytes[payload_at..at + len].split_at_mut(payload_len as usize);
    edit(payload, records);
    if recompute {
        bytes = format::reindexed(&bytes, &decoded.entries, &decoded.sources).unwrap();
    }
    std::fs::write(path, bytes).unwrap();
    true
}

/// A cold launch into a new file in `dir`: the program, its data, the file, and the output
/// without a cache.
fn packed_chain(dir: &Path) -> (PathBuf, PathBuf, PathBuf, Vec<f32>) {
    let (pte, ptd) = chain(dir, "chain", 0);
    let (reference, _) = launch(&pte, &ptd, None);
    let path = dir.join("chain.xbc");
    let (cold, stats) = launch(&pte, &ptd, Some(&path));
    assert_eq!(cold, reference, "cold");
    assert_eq!(stats.unwrap().packed, 6, "cold packs every layer");
    (pte, ptd, path, reference)
}

/// A warm launch of the chain with the file at `path`: right, every weight found, nothing
/// packed (`why` says how the identities were had). Returns what the cache did.
fn warm_finds_every_weight(
    (pte, ptd, path, reference): &(PathBuf, PathBuf, PathBuf, Vec<f32>),
    why: &str,
) -> CacheStats {
    let (warm, stats) = launch(pte, ptd, Some(path));
    let stats = stats.unwrap();
    assert_eq!(&warm, reference, "{why}");
    assert_eq!((stats.hits, stats.packed), (6, 0), "{why}: {stats:?}");
    stats
}

#[test]
fn a_warm_launch_reads_its_identities_back_and_finds_every_weight() {
    let dir = common::scratch("identities-read-back");
    let chain = packed_chain(&dir);
    assert!(
        craft_record(&chain.2, |_| {}),
        "the cold launch kept a record"
    );
    let stats = warm_finds_every_weight(&chain, "read back");
    assert!(stats.kept_served >= 1, "the record is read: {stats:?}");
}

#[test]
fn a_record_that_does_not_read_as_one_is_described_again() {
    let dir = common::scratch("identities-unreadable");
    let chain = packed_chain(&dir);
    // A state no record holds, in the first constant value's.
    assert!(craft_record(&chain.2, |records| records[0] = 7));
    warm_finds_every_weight(&chain, "described again");
}

/// Trades the identities of the first and third registered constant values of the chain's
/// records (per layer a weight and a bias: two weights). Each record is a state byte and a
/// 32-byte identity.
fn swap_two_weights(records: &mut [u8]) {
    let registered: Vec<usize> = (0..records.len() / 33)
        .filter(|&r| records[r * 33] == 1)
        .collect();
    let [a, _, b, ..] = registered[..] else {
        panic!("the record names at least two weights");
    };
    let (a, b) = (a * 33 + 1, b * 33 + 1);
    let first: Vec<u8> = records[a..a + 32].to_vec();
    records.copy_within(b..b + 32, a);
    records[b..b + 32].copy_from_slice(&first);
}

#[test]
fn a_record_of_another_payload_is_never_acted_on() {
    let dir = common::scratch("identities-other-payload");
    let chain = packed_chain(&dir);
    // A record that lies (two weights' identities traded: acted on, it misplaces them and they
    // are packed again), found under this payload's length and hash with its checksums right,
    // but made for other bytes: compared, it is never acted on.
    assert!(craft_record(&chain.2, swap_two_weights));
    assert!(craft_payload_copy(&chain.2));
    let stats = warm_finds_every_weight(&chain, "compared with the payload, described again");
    assert_eq!(
        stats.corrupt_found, 0,
        "consistent, only not this payload's: {stats:?}"
    );
}

#[test]
fn a_damaged_record_is_never_acted_on() {
    let dir = common::scratch("identities-damaged");
    let chain = packed_chain(&dir);
    // A bit flipped in the first registered identity, its checksum left as it was.
    assert!(edit_record(&chain.2, |records| records[1] ^= 0x10, false));
    let stats = warm_finds_every_weight(&chain, "checked before use, described again");
    assert!(stats.corrupt_found >= 1, "{stats:?}");
}

#[test]
fn a_record_that_swaps_two_weights_finds_neither_in_the_wrong_place() {
    let dir = common::scratch("identities-swapped");
    let (pte, ptd, path, reference) = packed_chain(&dir);
    // Each constant value's record: a state byte and a 32-byte identity. The chain's values
    // are, per layer, a weight and a bias; the first two registered weights trade identities.
    assert!(craft_record(&path, swap_two_weights));
    let (lied_to, stats) = launch(&pte, &ptd, Some(&path));
    let stats = stats.unwrap();
    assert_eq!(
        lied_to, reference,
        "the launch that meets the lie: {stats:?}"
    );
    assert!(
        stats.packed > 0,
        "what the lie misplaces is packed again: {stats:?}"
    );
}

/// One launch of `pte` with the cache file `path`, its packed weights checked in the background
/// and the check recorded beside the file (as the ExecuTorch backend and `xnnblob run` launch):
/// what the cache did, once its save and check are done.
fn launch_checked(pte: &Path, ptd: &Path, path: &Path) -> CacheStats {
    use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
    use xnnblob::cache::{CacheOptions, VerifyPacked};
    let backend = Backend::new(BackendOptions {
        threads: 1,
        cache_options: CacheOptions {
            verify: VerifyPacked::Background,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let choice = WeightsCacheChoice::File(path.to_path_buf());
    let program =
        xnnblob::program::Program::load(&backend, pte, &[ptd.to_path_buf()], Some(&choice))
            .unwrap();
    let mut method = program.method("forward").unwrap();
    let input: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    method.execute_f32(&[&input]).unwrap();
    let file = backend.file_cache(path).unwrap();
    file.wait_saved().unwrap();
    file.stats()
}

/// Issue 61: a file recorded as checked as it is now has every entry's bytes checked, the
/// record of identities among them: a warm launch reads it back without hashing it again.
#[test]
fn a_warm_launch_of_a_file_recorded_as_checked_hashes_no_kept_identities() {
    let dir = common::scratch("identities-recorded");
    let (pte, ptd) = chain(&dir, "chain", 0);
    let path = dir.join("chain.xbc");
    let cold = launch_checked(&pte, &ptd, &path);
    assert_eq!(cold.packed, 6, "cold packs every layer");
    let mut record = path.as_os_str().to_owned();
    record.push(".checked");
    assert!(Path::new(&record).exists(), "the save recorded its check");
    let warm = launch_checked(&pte, &ptd, &path);
    assert_eq!((warm.hits, warm.packed), (6, 0), "{warm:?}");
    assert!(
        warm.kept_served >= 1,
        "the identities are read back: {warm:?}"
    );
    assert_eq!(
        warm.checked, 0,
        "recorded as checked: nothing hashed: {warm:?}"
    );
    // Without the record the file's entries, the identities among them, are checked again.
    std::fs::remove_file(&record).unwrap();
    let unrecorded = launch_checked(&pte, &ptd, &path);
    assert_eq!((unrecorded.hits, unrecorded.packed), (6, 0));
    assert!(unrecorded.checked >= 1, "{unrecorded:?}");
}
