//! A bounded packed-weight cache: each save evicts the entries not used for longest beyond the
//! budget (twice the saving process's live bytes by default), never those the process used.

use crate::common;

use common::scratch;
use std::path::Path;
use std::sync::Arc;
use xnnblob::cache::{
    CacheBudget, CacheOptions, FileReport, PackedWeightsCache, compact_file, verify_file,
};
use xnnblob::xnn::Runtime;
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

/// The model an app ships in `month`: same shape, new weights.
fn release(month: u64) -> Mlp {
    Mlp::random(&[64, 256, 128, 32], 100 + month)
}

fn open(path: &Path, budget: CacheBudget) -> Arc<PackedWeightsCache> {
    PackedWeightsCache::open_with(
        path,
        CacheOptions {
            blocking_save: true,
            budget,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Loads and runs each model through `cache`, then finalizes (the save); returns the outputs.
fn launch(cache: &PackedWeightsCache, models: &[&Mlp]) -> Vec<Vec<f32>> {
    let registrations = common::register_mlps(cache, models);
    let graphs: Vec<_> = models.iter().map(|m| m.subgraph(1).unwrap()).collect();
    let mut runtimes: Vec<_> = graphs
        .iter()
        .map(|g| Runtime::new(g, Some(cache)).unwrap())
        .collect();
    drop(registrations);
    cache.finalize().unwrap();
    models
        .iter()
        .zip(&mut runtimes)
        .map(|(m, rt)| {
            let input: Vec<f32> = (0..m.input_width()).map(|i| (i % 7) as f32 / 7.0).collect();
            let mut out = vec![0.0; m.output_width()];
            rt.invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
                .unwrap();
            out
        })
        .collect()
}

/// One process: opens the file, runs `models`, saves, exits. The cache's stats on the way out.
fn process(path: &Path, budget: CacheBudget, models: &[&Mlp]) -> xnnblob::cache::CacheStats {
    let cache = open(path, budget);
    launch(&cache, models);
    let stats = cache.stats();
    drop(cache);
    stats
}

fn report(path: &Path) -> FileReport {
    verify_file(path, &CacheOptions::default(), true, false)
        .unwrap()
        .unwrap()
}

/// Packed bytes of one model's entries in a file.
fn packed_size_of(mlp: &Mlp) -> u64 {
    let dir = scratch("size-of");
    let path = dir.join("one.xbc");
    process(&path, CacheBudget::Unlimited, &[mlp]);
    report(&path).packed_bytes
}

#[test]
fn a_model_updated_every_month_keeps_the_file_within_twice_its_size() {
    let one = packed_size_of(&release(0));
    let dir = scratch("monthly");
    let bounded = dir.join("bounded.xbc");
    let unbounded = dir.join("unbounded.xbc");
    for month in 0..12 {
        let model = release(month);
        let stats = process(&bounded, CacheBudget::TwiceLive, &[&model]);
        assert_eq!(stats.packed, 3, "month {month}: a new release packs");
        process(&unbounded, CacheBudget::Unlimited, &[&model]);
        let r = report(&bounded);
        assert!(r.packed_bytes <= 2 * one, "month {month}: {r:?}");
        assert_eq!(r.live_bytes, one);
        assert!(r.corrupt.is_empty() && r.invalid_entries == 0);
    }
    assert_eq!(report(&unbounded).packed_bytes, 12 * one);
    let r = report(&bounded);
    assert_eq!(
        (r.packed_bytes, r.stale_bytes, r.evictable_bytes),
        (2 * one, one, 0),
        "this month's and last month's"
    );
    // This month's release is warm; last month's too; older ones were evicted.
    assert_eq!(
        process(&bounded, CacheBudget::TwiceLive, &[&release(11)]).packed,
        0
    );
    assert_eq!(
        process(&bounded, CacheBudget::TwiceLive, &[&release(10)]).packed,
        0
    );
    assert_eq!(
        process(&bounded, CacheBudget::TwiceLive, &[&release(9)]).packed,
        3
    );
}

#[test]
fn entries_the_saving_process_used_are_never_evicted() {
    let dir = scratch("live-stays");
    let path = dir.join("w.xbc");
    let (a, b) = (release(1), release(2));
    let none = CacheBudget::Bytes(0);
    process(&path, none, &[&a]);
    let stats = process(&path, none, &[&b]);
    assert_eq!(stats.evicted, 3, "a's three entries leave");
    assert_eq!(report(&path).packed_bytes, packed_size_of(&b));
    // A process that uses both keeps both, whatever the budget.
    let stats = process(&path, none, &[&a, &b]);
    assert_eq!((stats.packed, stats.hits, stats.evicted), (3, 3, 0));
    assert_eq!(report(&path).entries, 6);
}

#[test]
fn the_model_not_used_for_longest_leaves_first() {
    let dir = scratch("lru");
    let path = dir.join("w.xbc");
    let (a, b, c) = (release(1), release(2), release(3));
    let two_models = CacheBudget::Bytes(2 * packed_size_of(&a));
    process(&path, two_models, &[&a]);
    process(&path, two_models, &[&b]);
    // A is used again by a process that also packs C: B is now the one not used for longest.
    let stats = process(&path, two_models, &[&a, &c]);
    assert_eq!((stats.hits, stats.packed, stats.evicted), (3, 3, 3));
    assert_eq!(process(&path, two_models, &[&a, &c]).packed, 0);
    assert_eq!(process(&path, two_models, &[&b]).packed, 3, "b was evicted");
}

#[test]
fn outputs_are_the_same_whatever_was_evicted() {
    let dir = scratch("evicted-outputs");
    let path = dir.join("w.xbc");
    let models: Vec<Mlp> = (0..4).map(release).collect();
    let expected: Vec<Vec<f32>> = models
        .iter()
        .map(|m| launch(&PackedWeightsCache::in_memory(), &[m]).remove(0))
        .collect();
    for round in 0..3 {
        for (m, want) in models.iter().zip(&expected) {
            let cache = open(&path, CacheBudget::TwiceLive);
            assert_eq!(&launch(&cache, &[m])[0], want, "round {round}");
        }
    }
}

#[test]
fn compaction_evicts_what_the_next_save_would() {
    let dir = scratch("compact-evicts");
    let path = dir.join("w.xbc");
    let big = Mlp::random(&[64, 512, 256, 32], 7);
    let small = release(1);
    process(&path, CacheBudget::Unlimited, &[&big]);
    process(&path, CacheBudget::Unlimited, &[&small]);
    let before = report(&path);
    assert_eq!(before.live_bytes, packed_size_of(&small));
    assert_eq!(before.stale_bytes, packed_size_of(&big));
    // The big model's largest layer is enough to get within twice the small one's.
    assert!(before.evictable_bytes > 0 && before.evictable_bytes < before.stale_bytes);
    let compacted = compact_file(&path, &CacheOptions::default())
        .unwrap()
        .unwrap();
    assert_eq!(compacted.evicted, 1);
    let after = report(&path);
    assert_eq!(after.entries, 5);
    assert_eq!(
        after.stale_bytes,
        before.stale_bytes - before.evictable_bytes
    );
    assert!(after.packed_bytes <= 2 * after.live_bytes);
    assert_eq!(process(&path, CacheBudget::TwiceLive, &[&small]).packed, 0);
}
