//! A cold launch holds resident only what it is packing: each region XNNPACK finishes is summed
//! and written into the draft of the cache file without mapping its pages (they are in the page
//! cache), so the launch's peak is not every packed byte so far beside the next weight's
//! unpacked bytes. The save maps none of them; the runtime maps them when it first runs.
//!
//! Residency is read from `/proc/self/smaps`, the kernel's account of this process's mappings:
//! host only, as qemu-user does not report a guest's resident pages.

use crate::common;

use crate::packed_cache::{assert_matches_reference, input_for};
use common::scratch;
use xnnblob::cache::{CacheOptions, HeapFirst, PackedWeightsCache};
use xnnblob::xnn::Runtime;
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

/// The address range of the mapping of the file whose path contains `name` (the draft's window).
fn mapping_of(name: &str) -> (u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let line = smaps
        .lines()
        .find(|l| l.contains(name) && l.contains("xnnblob-draft"))
        .unwrap_or_else(|| panic!("no mapping of a draft in {name}"));
    let (start, end) = line
        .split_whitespace()
        .next()
        .unwrap()
        .split_once('-')
        .unwrap();
    (
        u64::from_str_radix(start, 16).unwrap(),
        u64::from_str_radix(end, 16).unwrap(),
    )
}

/// A field in KiB of the mapping at `range` (`Rss`, `KernelPageSize`), whatever its file is
/// called now.
fn field_kib(range: (u64, u64), field: &str) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{:x}-{:x} ", range.0, range.1);
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    assert!(lines.next().is_some(), "the mapping {head}is gone");
    // Every mapping lists every field, so the first found after its head is its own.
    let line = lines
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} for {head}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn resident_kib(range: (u64, u64)) -> u64 {
    field_kib(range, "Rss")
}

#[test]
fn a_cold_launch_maps_none_of_what_it_packs_until_the_runtime_runs() {
    let dir = scratch("cold-residency");
    let path = dir.join("weights.xbc");
    // Three fp32 layers of 0.25-1 MiB packed.
    let mlp = Mlp::random(&[512, 512, 512, 256], 5);
    let options = CacheOptions {
        blocking_save: true,
        // Into a draft of the file from the first byte, as a model past its first 4 MiB packs.
        heap_first: HeapFirst(0),
        ..Default::default()
    };
    let cache = PackedWeightsCache::open_with(&path, options).unwrap();
    let registrations = common::register_mlps(&cache, &[&mlp]);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(&*cache)).unwrap();
    drop(registrations);
    let stats = cache.stats();
    assert_eq!((stats.packed, stats.heap_entries), (3, 0));
    let packed_kib = stats.packed_bytes as u64 / 1024;
    assert!(packed_kib > 1024, "{packed_kib} KiB packed");
    let window = mapping_of(dir.file_name().unwrap().to_str().unwrap());
    let packed = resident_kib(window);
    assert_eq!(
        packed, 0,
        "{packed} KiB of {packed_kib} KiB packed are mapped"
    );
    // The save completes the draft (its header, index and trailer) and maps nothing of it.
    cache.finalize().unwrap();
    assert_eq!(cache.saves(), 1);
    let saved = resident_kib(window);
    assert_eq!(saved, 0, "the save mapped {saved} KiB");
    // The run maps them, from the page cache, and computes what was packed.
    let input = input_for(&mlp);
    let mut out = vec![f32::NAN; mlp.output_width()];
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    let ran = resident_kib(window);
    assert!(
        ran >= packed_kib * 9 / 10,
        "after a run {ran} KiB of {packed_kib} KiB are resident"
    );
    assert_matches_reference(&mlp, &out);
    drop(runtime);
    drop(cache);
    std::fs::remove_dir_all(&dir).unwrap();
}
