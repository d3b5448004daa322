//! Cache files whose index lies, with every checksum recomputed so that nothing but the lie is
//! wrong (issue 38): an entry cut short at the end of the packed data or in the middle, two
//! entries' keys swapped, a region moved onto another. Each launch through them gives the
//! outputs of a launch without a cache file, the lie is repacked, and the next save repairs the
//! file, also after `compact` and after another program saved into the same file. The fuzz
//! target `cache_lookups` tries such edits at random.

use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::format::{self, Compat, FileEntry};
use xnnblob::cache::{CacheOptions, compact_file};
use xnnblob::program::Program;
use xnnblob_test_support::builder::GraphBuilder;

use crate::common;

/// A chain of fully connected layers, each larger than the one before, so that every packed
/// entry has a size of its own: `chain.pte` and `chain.ptd` in `dir`. `seed` varies the weights.
pub(crate) fn chain(dir: &Path, name: &str, seed: u32) -> (PathBuf, PathBuf) {
    let mut g = GraphBuilder::new();
    let mut x = g.input(&[1, 16]);
    for layer in 0..6u32 {
        let (inputs, outputs) = (16 * (layer + 1), 16 * (layer + 2));
        let w: Vec<f32> = (0..inputs * outputs)
            .map(|i| ((i * 7 + layer * 13 + seed) % 31) as f32 / 31.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..outputs).map(|i| (i % 5) as f32 * 0.1).collect();
        let wv = g.constant_f32(&[outputs, inputs], &w);
        let bv = g.constant_f32(&[outputs], &b);
        x = g.fully_connected(x, wv, Some(bv), -4.0, 4.0);
    }
    g.output(x);
    let built = g.finish();
    let (pte, ptd) = (
        dir.join(format!("{name}.pte")),
        dir.join(format!("{name}.ptd")),
    );
    built.write_pte(&pte, "forward").unwrap();
    built.write_ptd(&ptd).unwrap();
    (pte, ptd)
}

pub(crate) struct Launch {
    pub(crate) output: Vec<f32>,
    packed: usize,
    wrong_size: usize,
    /// What the cache did, where there was one.
    pub(crate) stats: Option<xnnblob::cache::CacheStats>,
}

/// One launch (a backend of its own, as a process has) of `pte` with `cache`, if any.
pub(crate) fn launch(pte: &Path, ptd: &Path, cache: Option<&Path>) -> Launch {
    let backend = Backend::new(BackendOptions {
        threads: 1,
        ..Default::default()
    })
    .unwrap();
    let cache_arg = cache.map(|p| WeightsCacheChoice::File(p.to_path_buf()));
    let program = Program::load(&backend, pte, &[ptd.to_path_buf()], cache_arg.as_ref()).unwrap();
    let mut method = program.method("forward").unwrap();
    let input: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    let output = method.execute_f32(&[&input]).unwrap().remove(0);
    assert_eq!(output.len(), 16 * 7);
    let stats = cache.map(|path| {
        let file = backend.file_cache(path).unwrap();
        file.wait_saved().unwrap();
        file.stats()
    });
    Launch {
        output,
        packed: stats.as_ref().map_or(0, |s| s.packed),
        wrong_size: stats.as_ref().map_or(0, |s| s.wrong_size),
        stats,
    }
}

fn compat() -> Compat {
    Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    }
}

/// Rewrites the index of the cache file at `path` with `edit`, then recomputes each entry's
/// checksum over the bytes it now names and the index checksum: consistent, and lying.
fn craft(path: &Path, edit: impl FnOnce(&mut Vec<FileEntry>)) {
    let bytes = std::fs::read(path).unwrap();
    let decoded = format::decode(&bytes, &compat()).unwrap();
    let mut entries = decoded.entries.clone();
    edit(&mut entries);
    let crafted = format::reindexed(&bytes, &entries, &decoded.sources).unwrap();
    std::fs::write(path, crafted).unwrap();
}

/// Entries by offset: the last one's region ends where the packed data does.
fn by_offset(entries: &mut [FileEntry]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| entries[i].offset);
    order
}

/// A cold launch into a new file, then `edit`, then two launches: the first meets the lie and
/// must compute right, repacking what lies; the second must find the file repaired.
fn meets_the_lie_then_finds_it_repaired(name: &str, edit: impl FnOnce(&mut Vec<FileEntry>)) {
    let dir = common::scratch(name);
    let (pte, ptd) = chain(&dir, "chain", 0);
    let reference = launch(&pte, &ptd, None).output;
    let path = dir.join("chain.xbc");
    let cold = launch(&pte, &ptd, Some(&path));
    assert_eq!(cold.output, reference, "{name}: cold");
    assert_eq!(cold.packed, 6, "{name}: cold packs every layer");
    craft(&path, edit);
    let lied_to = launch(&pte, &ptd, Some(&path));
    assert_eq!(
        lied_to.output, reference,
        "{name}: the launch that meets the lie"
    );
    assert!(lied_to.packed > 0, "{name}: what lies is repacked");
    let repaired = launch(&pte, &ptd, Some(&path));
    assert_eq!(repaired.output, reference, "{name}: the next launch");
    assert_eq!(repaired.packed, 0, "{name}: the file was repaired");
    assert_eq!(repaired.wrong_size, 0, "{name}: the file was repaired");
}

#[test]
fn an_entry_cut_short_at_the_end_of_the_packed_data_is_repacked_and_repaired() {
    meets_the_lie_then_finds_it_repaired("short-at-end", |entries| {
        let last = *by_offset(entries).last().unwrap();
        entries[last].size /= 2;
    });
}

#[test]
fn an_entry_cut_short_in_the_middle_is_repacked_and_repaired() {
    meets_the_lie_then_finds_it_repaired("short-in-middle", |entries| {
        let middle = by_offset(entries)[entries.len() / 2];
        entries[middle].size -= 64;
    });
}

#[test]
fn entries_whose_keys_were_swapped_are_repacked_and_repaired() {
    meets_the_lie_then_finds_it_repaired("swapped", |entries| {
        let (a, b) = (0, entries.len() - 1);
        let key = entries[a].key;
        entries[a].key = entries[b].key;
        entries[b].key = key;
    });
}

#[test]
fn an_entry_moved_onto_another_is_dropped_and_repacked() {
    meets_the_lie_then_finds_it_repaired("misplaced", |entries| {
        let order = by_offset(entries);
        // The second region now starts inside the first: overlapping, so refused at load.
        entries[order[1]].offset = entries[order[0]].offset + 64;
    });
}

#[test]
fn a_short_entry_stays_harmless_after_compact_and_after_another_programs_save() {
    let dir = common::scratch("short-then-compact");
    let (pte, ptd) = chain(&dir, "chain", 0);
    let (other_pte, other_ptd) = chain(&dir, "other", 5);
    let reference = launch(&pte, &ptd, None).output;
    let other_reference = launch(&other_pte, &other_ptd, None).output;
    let path = dir.join("shared.xbc");
    launch(&pte, &ptd, Some(&path));
    craft(&path, |entries| {
        let middle = by_offset(entries)[entries.len() / 2];
        entries[middle].size -= 64;
    });
    // Compact rewrites tightly: the short entry's neighbour now follows it directly.
    compact_file(&path, &CacheOptions::default())
        .unwrap()
        .unwrap();
    // Another program saves into the same file, moving every region.
    let other = launch(&other_pte, &other_ptd, Some(&path));
    assert_eq!(other.output, other_reference);
    let lied_to = launch(&pte, &ptd, Some(&path));
    assert_eq!(lied_to.output, reference, "after compact and another save");
    assert_eq!(lied_to.wrong_size, 1);
    let repaired = launch(&pte, &ptd, Some(&path));
    assert_eq!(repaired.output, reference);
    assert_eq!(repaired.packed, 0);
}
