//! The persistent packed-weight cache with real XNNPACK: cold packs and saves, warm packs
//! nothing; stale, torn and corrupt files are rebuilt or repacked, never trusted.
//!
//! Here: the launch helpers other areas share, cold and warm launches, drafts and saves, and
//! threads and processes sharing one cache. Stale, torn and foreign files: `rejected_files`;
//! damaged packed bytes and the checks that find them: `damaged_entries`.

use crate::common;

use common::scratch;

use std::path::Path;
use std::sync::Arc;
use xnnblob::cache::{
    BlobId, CacheOptions, HeapFirst, LoadOutcome, PackedWeightsCache, Registration, format,
    verify_file,
};
use xnnblob::xnn::Runtime;
use xnnblob::xnn::activity::Inference;
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

mod damaged_entries;
mod rejected_files;

pub(crate) fn input_for(mlp: &Mlp) -> Vec<f32> {
    (0..mlp.input_width())
        .map(|i| ((i % 11) as f32 - 5.0) / 5.0)
        .collect()
}

pub(crate) fn register<'a>(cache: &'a PackedWeightsCache, mlp: &'a Mlp) -> Vec<Registration<'a>> {
    common::register_mlps(cache, &[mlp])
}

/// Creates a runtime through the cache, finalizes, runs once: what a model load does.
pub(crate) fn launch(cache: &PackedWeightsCache, mlp: &Mlp) -> Vec<f32> {
    let registrations = register(cache, mlp);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(cache)).unwrap();
    drop(registrations);
    cache.finalize().unwrap();
    let input = input_for(mlp);
    let mut out = vec![f32::NAN; mlp.output_width()];
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    out
}

pub(crate) fn assert_matches_reference(mlp: &Mlp, out: &[f32]) {
    let expected = mlp.reference_forward(&input_for(mlp), 1);
    for (a, b) in out.iter().zip(&expected) {
        assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
    }
}

/// A fresh process's view: the previous cache object is gone, the file is opened again.
pub(crate) fn reopen(path: &Path) -> Arc<PackedWeightsCache> {
    PackedWeightsCache::open(path).unwrap()
}

pub(crate) fn model() -> Mlp {
    Mlp::random(&[48, 64, 40, 24], 9)
}

/// A cold launch on an empty file; returns the outputs and the file's size.
pub(crate) fn cold(path: &Path, mlp: &Mlp) -> (Vec<f32>, u64) {
    let cache = reopen(path);
    let out = launch(&cache, mlp);
    drop(cache);
    (out, std::fs::metadata(path).unwrap().len())
}

#[test]
fn cold_then_warm_packs_nothing_and_gives_identical_outputs() {
    let dir = scratch("cold-warm");
    let path = dir.join("weights.xbc");
    let mlp = model();

    let cache = reopen(&path);
    assert_eq!(cache.load_outcome(), &LoadOutcome::Fresh);
    let cold_out = launch(&cache, &mlp);
    cache.wait_saved().unwrap();
    let s = cache.stats();
    assert_eq!((s.packed, s.entries, s.unsaved), (3, 3, 0));
    assert_eq!(cache.saves(), 1);
    drop(cache);

    let cache = reopen(&path);
    assert_eq!(
        cache.load_outcome(),
        &LoadOutcome::Loaded {
            entries: 3,
            dropped: 0
        }
    );
    let warm_out = launch(&cache, &mlp);
    let s = cache.stats();
    assert_eq!(s.packed, 0, "warm launch packed nothing");
    assert_eq!(s.hits, 3);
    assert_eq!(cache.saves(), 0, "nothing new, nothing written");
    assert_eq!(cold_out, warm_out, "bit-identical");
    assert_matches_reference(&mlp, &warm_out);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cold_launch_packs_straight_into_the_file_it_publishes() {
    let dir = scratch("blocking");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let options = CacheOptions {
        blocking_save: true,
        // As a model past the first 4 MiB packs.
        heap_first: HeapFirst(0),
        ..Default::default()
    };
    let cache = PackedWeightsCache::open_with(&path, options).unwrap();
    let registrations = register(&cache, &mlp);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(&*cache)).unwrap();
    drop(registrations);
    // Packed into a draft of the file beside it, never on the heap.
    assert_eq!(cache.stats().packed, 3);
    assert_eq!(cache.stats().heap_entries, 0, "no packed byte on the heap");
    assert_eq!(drafts_in(&dir).len(), 1, "one draft while packing");
    assert!(!path.exists(), "nothing published before the save");
    cache.finalize().unwrap();
    assert_eq!(cache.saves(), 1, "saved before finalize returned");
    assert!(drafts_in(&dir).is_empty(), "the draft became the file");
    let report = verify_file(&path, &CacheOptions::default(), true, false)
        .unwrap()
        .unwrap();
    assert_eq!((report.entries, report.corrupt.len()), (3, 0));
    // The runtime reads its packed weights where they were packed: in the published file.
    assert_runs_right(&mut runtime, &mlp);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Names of the drafts in `dir`.
fn drafts_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("xnnblob-draft"))
        .collect()
}

/// Runs `runtime`, created from `mlp`, once and checks its output against the reference.
fn assert_runs_right(runtime: &mut Runtime, mlp: &Mlp) {
    let input = input_for(mlp);
    let mut out = vec![0f32; mlp.output_width()];
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    assert_matches_reference(mlp, &out);
}

/// A cold launch of one model with `options`: what it packed on the heap, whether a draft was
/// made while packing, and the sizes of the saved file's entries in file order.
fn cold_launch_with(dir: &Path, options: CacheOptions) -> (usize, bool, Vec<u64>) {
    let path = dir.join("weights.xbc");
    let mlp = model();
    let cache = PackedWeightsCache::open_with(&path, options).unwrap();
    let registrations = register(&cache, &mlp);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(&*cache)).unwrap();
    drop(registrations);
    let (heap, drafted) = (cache.stats().heap_entries, !drafts_in(dir).is_empty());
    cache.finalize().unwrap();
    assert!(drafts_in(dir).is_empty(), "no draft left after the save");
    assert_runs_right(&mut runtime, &mlp);
    let report = verify_file(&path, &CacheOptions::default(), true, false)
        .unwrap()
        .unwrap();
    assert_eq!((report.entries, report.corrupt.len()), (3, 0));
    let decoded = format::decode(&std::fs::read(&path).unwrap(), &default_compat()).unwrap();
    // File order: by offset (the index lists entries by key).
    let mut in_file: Vec<&format::FileEntry> = decoded.entries.iter().collect();
    in_file.sort_by_key(|e| e.offset);
    let sizes = in_file.iter().map(|e| e.size).collect();
    // The next launch maps what the save wrote and packs nothing.
    drop(runtime);
    drop(cache);
    let warm = reopen(&path);
    assert_matches_reference(&mlp, &launch(&warm, &mlp));
    assert_eq!((warm.stats().hits, warm.stats().packed), (3, 0));
    (heap, drafted, sizes)
}

#[test]
fn a_small_model_packs_on_the_heap_and_a_larger_one_into_a_draft_past_its_first_bytes() {
    let blocking = |heap_first| CacheOptions {
        blocking_save: true,
        heap_first,
        ..Default::default()
    };
    // Under the default 4 MiB: every weight on the heap, no file made while packing.
    let dir = scratch("heap-first-small");
    let (heap, drafted, sizes) = cold_launch_with(&dir, blocking(HeapFirst::default()));
    assert_eq!((heap, drafted), (3, false));
    std::fs::remove_dir_all(&dir).unwrap();
    // Room on the heap for the first weight packed only: the other two go into a draft, which
    // the save publishes with the first written after them.
    let first = sizes[0] as usize;
    assert!(sizes.iter().all(|&s| s > 0) && first < sizes.iter().sum::<u64>() as usize);
    let dir = scratch("heap-first-mixed");
    let (heap, drafted, _) = cold_launch_with(&dir, blocking(HeapFirst(first)));
    assert_eq!((heap, drafted), (1, true));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn runtimes_run_while_a_background_save_is_in_progress() {
    let dir = scratch("background");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let cache = reopen(&path);
    // finalize returns at once; outputs are right whether or not the save has finished.
    for _ in 0..3 {
        assert_matches_reference(&mlp, &launch(&cache, &mlp));
    }
    cache.wait_saved().unwrap();
    assert_eq!(cache.saves(), 1);
    assert!(path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_background_save_waits_for_inference_to_pause() {
    let dir = scratch("inference-pause");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let cache = reopen(&path);
    // An app generating: inference counts from before the load to the end of its last token.
    let generating = Inference::begin();
    assert_matches_reference(&mlp, &launch(&cache, &mlp));
    // Long past the packing pause (100 ms) that would start a save with no inference.
    for _ in 0..10 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(cache.saves(), 0, "no save while inference runs");
    }
    assert!(!path.exists());
    drop(generating);
    // Then it starts by itself (within the pause, or at worst the 10 s longest wait for other
    // tests' runtimes in this process), with no one waiting for it.
    let mut polls = 0;
    while cache.saves() == 0 {
        polls += 1;
        assert!(polls < 600, "no save 30 s after inference paused");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn opening_a_path_twice_in_one_process_gives_one_cache() {
    let dir = scratch("registry");
    let a = PackedWeightsCache::open(dir.join("c.xbc")).unwrap();
    let b = PackedWeightsCache::open(dir.join(".").join("c.xbc")).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let other = PackedWeightsCache::open(dir.join("d.xbc")).unwrap();
    assert!(!Arc::ptr_eq(&a, &other));
}

#[test]
fn issue_20833_hundred_reload_cycles_leave_size_and_mtime_unchanged() {
    let dir = scratch("reload");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (first, size) = cold(&path, &mlp);
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    for _ in 0..100 {
        let cache = reopen(&path);
        assert_eq!(launch(&cache, &mlp), first);
        assert_eq!(cache.stats().packed, 0);
    }
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), size);
    assert_eq!(meta.modified().unwrap(), mtime);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_models_sharing_weights_store_shared_entries_once() {
    let dir = scratch("shared");
    let path = dir.join("weights.xbc");
    let a = model();
    let mut b = model();
    // b shares a's first two layers, and has its own last layer.
    b.layers[2] = Mlp::random(&[40, 24], 77).layers.remove(0);
    let cache = reopen(&path);
    launch(&cache, &a);
    launch(&cache, &b);
    let s = cache.stats();
    assert_eq!(s.entries, 4, "3 of a + 1 new of b");
    assert_eq!(s.packed, 4);
    drop(cache);
    let decoded = format::decode(&std::fs::read(&path).unwrap(), &default_compat()).unwrap();
    assert_eq!(decoded.entries.len(), 4);
    let cache = reopen(&path);
    launch(&cache, &b);
    launch(&cache, &a);
    assert_eq!(cache.stats().packed, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn default_compat() -> format::Compat {
    format::Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    }
}

#[test]
fn issue_19682_eight_threads_creating_runtimes_over_one_cache() {
    let dir = scratch("threads");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let cache = reopen(&path);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let out = launch(&cache, &mlp);
                assert_matches_reference(&mlp, &out);
            });
        }
    });
    assert_eq!(cache.stats().entries, 3);
    drop(cache);
    let decoded = format::decode(&std::fs::read(&path).unwrap(), &default_compat()).unwrap();
    assert_eq!(decoded.entries.len(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn issue_18946_null_bias_is_a_normal_key() {
    // Fully connected layers without bias: XNNPACK passes a NULL bias pointer.
    use xnnblob::xnn::{Subgraph, ValueRole};
    let dir = scratch("null-bias");
    let path = dir.join("weights.xbc");
    let w: Vec<f32> = (0..32 * 16).map(|i| ((i % 7) as f32 - 3.0) / 7.0).collect();
    let build_and_run = |cache: &PackedWeightsCache| -> Vec<f32> {
        let _reg = cache.register(&w, BlobId::of_f32s(&w));
        let mut g = Subgraph::new(2).unwrap();
        let x = g.define_f32_tensor(&[1, 32], ValueRole::Input(0)).unwrap();
        let wv = g
            .define_f32_tensor(&[16, 32], ValueRole::static_f32(&w))
            .unwrap();
        let y = g.define_f32_tensor(&[1, 16], ValueRole::Output(1)).unwrap();
        g.define_fully_connected(x, wv, None, y, f32::NEG_INFINITY, f32::INFINITY)
            .unwrap();
        let mut rt = Runtime::new(&g, Some(cache)).unwrap();
        cache.finalize().unwrap();
        let input = vec![0.5f32; 32];
        let mut out = vec![0f32; 16];
        rt.invoke(&[(0, &input)], &mut [(1, &mut out)]).unwrap();
        out
    };
    let cache = reopen(&path);
    let cold = build_and_run(&cache);
    assert_eq!(cache.stats().packed, 1);
    drop(cache);
    let cache = reopen(&path);
    assert_eq!(build_and_run(&cache), cold);
    assert_eq!(cache.stats().packed, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn in_memory_cache_shares_packing_without_a_file() {
    let mlp = model();
    let cache = PackedWeightsCache::in_memory();
    let a = launch(&cache, &mlp);
    let b = launch(&cache, &mlp);
    assert_eq!(a, b);
    let s = cache.stats();
    assert_eq!((s.packed, s.hits, s.entries), (3, 3, 3));
    assert_eq!(cache.saves(), 0);
}

#[test]
fn unregistered_weights_are_packed_but_never_saved() {
    let dir = scratch("unregistered");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let cache = reopen(&path);
    let graph = mlp.subgraph(1).unwrap();
    let _rt = Runtime::new(&graph, Some(&*cache)).unwrap();
    cache.finalize().unwrap();
    let s = cache.stats();
    assert_eq!((s.packed, s.unregistered, s.entries), (3, 3, 0));
    assert!(!path.exists(), "nothing to save, no file");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Child mode for the multi-process test: a cold start on the path in the environment.
#[test]
fn child_cold_start() {
    let Ok(path) = std::env::var("XNNBLOB_TEST_CACHE_PATH") else {
        return;
    };
    let mlp = model();
    let cache = reopen(Path::new(&path));
    let out = launch(&cache, &mlp);
    assert_matches_reference(&mlp, &out);
}

#[test]
fn four_processes_cold_starting_one_path_leave_one_valid_1x_file() {
    let dir = scratch("processes");
    let path = dir.join("weights.xbc");
    let mlp = model();
    let (_, size) = cold(&dir.join("reference.xbc"), &mlp);
    let children: Vec<_> = (0..4)
        .map(|_| {
            crate::common::this_test_binary()
                .args([
                    "--exact",
                    &crate::common::test_path(module_path!(), "child_cold_start"),
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("XNNBLOB_TEST_CACHE_PATH", &path)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    let cache = reopen(&path);
    launch(&cache, &mlp);
    assert_eq!(cache.stats().packed, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn issue_22779_unpacked_constants_stay_readable_after_packing_and_finalize() {
    // One blob is both a fully connected weight (packed; its mapped pages are released once
    // packed) and the constant operand of an add, which XNNPACK reads at every inference.
    use xnnblob::named_data::{FileDataMap, NamedBlobStore, NamedDataMap};
    use xnnblob::xnn::{Datatype, Subgraph, ValueRole};
    let dir = scratch("unpacked-constant");
    let n = 64;
    let w: Vec<f32> = (0..n * n)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 29.0)
        .collect();
    let w_bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut store = NamedBlobStore::new();
    store
        .add_named_blob("w", &w_bytes, 64, "model", None)
        .unwrap();
    store
        .add_named_blob("tail", &[0u8; 256], 64, "model", None)
        .unwrap(); // slack after "w"
    let ptd = dir.join("model.ptd");
    store.write_ptd("model", &ptd).unwrap();

    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let x2: Vec<f32> = (0..n * n).map(|i| (i as f32 * 0.01).cos()).collect();
    let fc_expected: Vec<f32> = (0..n)
        .map(|o| (0..n).map(|k| x[k] * w[o * n + k]).sum())
        .collect();
    let add_expected: Vec<f32> = x2.iter().zip(&w).map(|(a, b)| a + b).collect();

    for launch in ["cold", "warm"] {
        let map = FileDataMap::open_ptd(&ptd).unwrap();
        let data = map.get_data("w").unwrap();
        let cache = reopen(&dir.join("weights.xbc"));
        let _reg = cache.register_buffer(&data, BlobId::of_bytes(&w_bytes));
        let mut g = Subgraph::new(4).unwrap();
        let xi = g.define_f32_tensor(&[1, n], ValueRole::Input(0)).unwrap();
        let wv = g
            .define_tensor(Datatype::Fp32, &[n, n], ValueRole::Static(data.data()))
            .unwrap();
        let yo = g.define_f32_tensor(&[1, n], ValueRole::Output(1)).unwrap();
        g.define_fully_connected(xi, wv, None, yo, f32::NEG_INFINITY, f32::INFINITY)
            .unwrap();
        let x2i = g.define_f32_tensor(&[n * n], ValueRole::Input(2)).unwrap();
        let wc = g
            .define_tensor(Datatype::Fp32, &[n * n], ValueRole::Static(data.data()))
            .unwrap();
        let zo = g.define_f32_tensor(&[n * n], ValueRole::Output(3)).unwrap();
        g.define_add(x2i, wc, zo).unwrap();
        let mut rt = Runtime::new(&g, Some(&*cache)).unwrap();
        cache.finalize().unwrap();
        let expected_packs = if launch == "cold" { 1 } else { 0 };
        assert_eq!(cache.stats().packed, expected_packs, "{launch}");
        for _ in 0..3 {
            let (mut y, mut z) = (vec![0f32; n], vec![0f32; n * n]);
            rt.invoke(&[(0, &x), (2, &x2)], &mut [(1, &mut y), (3, &mut z)])
                .unwrap();
            for (a, b) in y.iter().zip(&fc_expected) {
                assert!((a - b).abs() < 1e-4, "{launch}: fc {a} vs {b}");
            }
            assert_eq!(
                z, add_expected,
                "{launch}: add read the constant after release"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_save_waits_a_bounded_time_for_another_writers_lock_and_leaves_the_file() {
    let dir = scratch("held-lock");
    let path = dir.join("weights.xbc");
    let mlp = model();
    // Another writer holds the lock (a separate open file description conflicts as another
    // process's would) and never lets go.
    let lock_path = dir.join("weights.xbc.lock");
    let holder = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap();
    holder.lock().unwrap();
    let cache = reopen(&path);
    let expected = launch(&cache, &mlp);
    // A save that waited for the lock without a limit would hang here; this one gives up.
    let saved = cache.finalize().and_then(|()| cache.wait_saved());
    let error = xnnblob::report::report(&saved.expect_err("the save gives up"));
    assert!(error.contains("writer lock"), "{error}");
    assert!(!path.exists(), "no file was written");
    assert_eq!(
        launch(&cache, &mlp),
        expected,
        "the weights stay usable in memory"
    );
    drop(holder);
}

/// Set by `aarch64::` to a cache file that another CPU class packed for [`model`].
pub(crate) const FOREIGN_CACHE_VAR: &str = "XNNBLOB_FOREIGN_CACHE";

/// Run by `aarch64::` under an emulated CPU, on a file packed on another CPU class (x86-64, or
/// an aarch64 CPU whose features pick other kernels): the file is rejected with one message
/// saying why, every weight is repacked, the outputs are right, and the next launch is warm.
#[test]
#[ignore = "run by aarch64:: with a file another CPU class packed"]
fn a_file_from_another_cpu_class_is_rejected_and_rebuilt() {
    let path = std::env::var_os(FOREIGN_CACHE_VAR).expect("aarch64:: sets the file");
    let mlp = model();
    let cache = reopen(Path::new(&path));
    let note = cache.load_note().expect("a rejected file is said once");
    println!("REJECTED {note}");
    assert!(
        matches!(cache.load_outcome(), LoadOutcome::Rejected(_)),
        "{note}"
    );
    let out = launch(&cache, &mlp);
    assert_matches_reference(&mlp, &out);
    assert_eq!(cache.stats().packed, 3, "every weight repacked");
    drop(cache);
    let cache = reopen(Path::new(&path));
    assert!(
        matches!(cache.load_outcome(), LoadOutcome::Loaded { dropped: 0, .. }),
        "rebuilt for this CPU"
    );
    assert_eq!(launch(&cache, &mlp), out);
    assert_eq!(cache.stats().packed, 0, "warm after the rebuild");
}

/// A save completes only the draft it takes with the sums taken as XNNPACK packed it; what an
/// earlier save published is read again, as any mapped entry is. Here the published file is cut
/// short before a second model packs: the first model's entries then read as zeros, and the
/// second save must leave them out rather than copy them under their old sums (which would
/// also record the new file as checked).
#[test]
fn a_later_save_reads_again_what_an_earlier_save_published() {
    let dir = scratch("later-save");
    let path = dir.join("weights.xbc");
    let options = CacheOptions {
        blocking_save: true,
        ..Default::default()
    };
    let cache = PackedWeightsCache::open_with(&path, options).unwrap();
    let (first, second) = (model(), Mlp::random(&[40, 56, 32], 21));
    let _ = launch(&cache, &first);
    assert_eq!(cache.saves(), 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let out = launch(&cache, &second);
    assert_matches_reference(&second, &out);
    assert_eq!(cache.saves(), 2);
    let report = verify_file(&path, &CacheOptions::default(), true, false)
        .unwrap()
        .unwrap();
    assert!(
        report.corrupt.is_empty(),
        "{} of {} entries of the new file are damaged",
        report.corrupt.len(),
        report.entries
    );
    assert!(report.entries >= 2, "{} entries", report.entries);
    drop(cache);
    std::fs::remove_dir_all(&dir).unwrap();
}
