//! Read-only layers under a cache file (an app's bundle of caches made ahead of time): a look-up
//! is served by the first layer that holds it, then by the writable file; only what none holds
//! is packed, into the writable file; a layer of another build or CPU class is ignored with one
//! note; a damaged layer entry is served at most once; nothing is ever written into a layer.

use crate::common;
use crate::packed_cache::assert_matches_reference;
use crate::read_only_damage::fifo_at_damage_record;

use common::scratch;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;
use xnnblob::cache::{
    CacheOptions, CacheStats, LayerOutcome, PackedWeightsCache, cpu_fingerprint, format,
    packing_class, verify_file,
};
use xnnblob::xnn::Runtime;
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

fn model(seed: u64) -> Mlp {
    Mlp::random(&[48, 64, 40, 24], seed)
}

fn open(path: &Path, options: CacheOptions) -> Arc<PackedWeightsCache> {
    PackedWeightsCache::open_with(
        path,
        CacheOptions {
            blocking_save: true,
            ..options
        },
    )
    .unwrap()
}

/// One process: opens the cache, loads and runs `mlp`, saves, exits. Its outputs and stats.
fn process(cache: Arc<PackedWeightsCache>, mlp: &Mlp) -> (Vec<f32>, CacheStats) {
    let registrations = common::register_mlps(&cache, &[mlp]);
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(&*cache)).unwrap();
    drop(registrations);
    cache.finalize().unwrap();
    let input: Vec<f32> = (0..mlp.input_width())
        .map(|i| ((i % 11) as f32 - 5.0) / 5.0)
        .collect();
    let mut out = vec![f32::NAN; mlp.output_width()];
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    cache.wait_saved().unwrap();
    let stats = cache.stats();
    drop(runtime);
    (out, stats)
}

/// A layer made by a cold launch at `path` (as `xnnblob prepack` makes one), with `options`.
fn make_layer(path: &Path, mlp: &Mlp, options: CacheOptions) {
    let (_, stats) = process(open(path, options), mlp);
    assert_eq!(stats.packed, 3);
}

fn layered(layers: &[&Path], state: &Path) -> CacheOptions {
    CacheOptions {
        layers: layers.iter().map(|p| p.to_path_buf()).collect(),
        state_dir: Some(state.to_path_buf()),
        ..Default::default()
    }
}

fn entries_in(path: &Path) -> usize {
    verify_file(path, &CacheOptions::default(), true, false)
        .unwrap()
        .unwrap()
        .entries
}

#[test]
fn a_launch_with_a_layer_packs_nothing_and_writes_nothing() {
    let dir = scratch("layers-served");
    let bundle = dir.join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let mlp = model(1);
    make_layer(&bundle.join("model.xbc"), &mlp, CacheOptions::default());
    let before = std::fs::read(bundle.join("model.xbc")).unwrap();

    // The directory stands for the files in it.
    let writable = dir.join("writable.xbc");
    let cache = open(&writable, layered(&[&bundle], &dir.join("state")));
    assert!(matches!(
        cache.layer_outcomes(),
        [LayerOutcome::Used { entries: 3, .. }]
    ));
    assert_eq!(cache.layer_note(), None);
    let (out, stats) = process(cache, &mlp);
    assert_eq!((stats.packed, stats.hits), (0, 3), "{stats:?}");
    assert_matches_reference(&mlp, &out);
    assert!(
        !writable.exists(),
        "nothing new: the writable file is not made"
    );
    assert_eq!(std::fs::read(bundle.join("model.xbc")).unwrap(), before);
}

#[test]
fn a_model_update_packs_only_the_changed_weights_into_the_writable_file() {
    let dir = scratch("layers-update");
    let layer = dir.join("v1.xbc");
    let v1 = model(2);
    make_layer(&layer, &v1, CacheOptions::default());
    let before = std::fs::read(&layer).unwrap();

    // Version 2 changes the last layer's weights only.
    let mut v2 = model(2);
    v2.layers.last_mut().unwrap().weights[0] += 0.5;
    let writable = dir.join("writable.xbc");
    let state = dir.join("state");
    let (out, stats) = process(open(&writable, layered(&[&layer], &state)), &v2);
    assert_eq!((stats.packed, stats.hits), (1, 2), "{stats:?}");
    assert_matches_reference(&v2, &out);
    assert_eq!(entries_in(&writable), 1, "only the new weight is written");
    assert_eq!(
        std::fs::read(&layer).unwrap(),
        before,
        "the layer is never written"
    );

    // The next launch finds it there, the rest in the layer.
    let (again, stats) = process(open(&writable, layered(&[&layer], &state)), &v2);
    assert_eq!((stats.packed, stats.hits), (0, 3), "{stats:?}");
    assert_eq!(again, out);
}

#[test]
fn a_layer_of_another_cpu_class_is_ignored_with_one_note_and_the_writable_file_takes_over() {
    let dir = scratch("layers-other-class");
    let layer = dir.join("other.xbc");
    let mlp = model(3);
    // Packed as if on a CPU of another class: one feature bit more.
    let other = cpu_fingerprint() ^ 1;
    assert_ne!(packing_class(other), packing_class(cpu_fingerprint()));
    make_layer(
        &layer,
        &mlp,
        CacheOptions {
            cpu_fingerprint: Some(other),
            ..Default::default()
        },
    );
    let writable = dir.join("writable.xbc");
    let state = dir.join("state");
    let cache = open(&writable, layered(&[&layer], &state));
    assert!(matches!(
        cache.layer_outcomes(),
        [LayerOutcome::Ignored {
            why: format::FileError::CpuMismatch { .. },
            ..
        }]
    ));
    let note = cache.layer_note().expect("one note");
    assert_eq!(note.lines().count(), 1, "{note}");
    assert!(
        note.contains("other.xbc") && note.contains("ignored"),
        "{note}"
    );
    let (out, stats) = process(cache, &mlp);
    assert_eq!(stats.packed, 3);
    assert_matches_reference(&mlp, &out);
    assert_eq!(entries_in(&writable), 3);

    let (_, stats) = process(open(&writable, layered(&[&layer], &state)), &mlp);
    assert_eq!(stats.packed, 0, "the writable file serves the next launch");
}

#[test]
fn a_layer_from_another_cpu_model_of_the_same_class_is_used() {
    let dir = scratch("layers-same-class");
    let layer = dir.join("same-class.xbc");
    let mlp = model(4);
    // Another CPU model's fingerprint with this CPU's features (bits 28, 40 and 33 are model
    // bits on both architectures): what the packing class leaves out, unless it changes a
    // layout. Bit 28 is the model's second bit on x86-64, which keeps a Zen 1 (family 0x17,
    // models 0x00-0x1F, whose f32 GEMM packs 16s4) a Zen 1; the others can take it out.
    let this = cpu_fingerprint();
    let other = [this ^ (1 << 28), this ^ (1 << 40), this ^ (1 << 33)]
        .into_iter()
        .find(|&f| packing_class(f) == packing_class(this))
        .expect("a CPU model of this packing class");
    assert_ne!(other, this);
    make_layer(
        &layer,
        &mlp,
        CacheOptions {
            cpu_fingerprint: Some(other),
            ..Default::default()
        },
    );
    let writable = dir.join("writable.xbc");
    let (out, stats) = process(
        open(&writable, layered(&[&layer], &dir.join("state"))),
        &mlp,
    );
    assert_eq!((stats.packed, stats.hits), (0, 3), "{stats:?}");
    assert_matches_reference(&mlp, &out);
}

#[test]
fn a_damaged_layer_entry_is_served_at_most_once_and_then_packed_into_the_writable_file() {
    let dir = scratch("layers-damaged");
    let layer = dir.join("damaged.xbc");
    let mlp = model(5);
    make_layer(&layer, &mlp, CacheOptions::default());
    let mut bytes = std::fs::read(&layer).unwrap();
    bytes[format::HEADER_SIZE + 100] ^= 0x10;
    std::fs::write(&layer, &bytes).unwrap();
    // A record is only trusted for a file that has not changed for a tick of its clock.
    std::thread::sleep(xnnblob::cache::SETTLED);

    let writable = dir.join("writable.xbc");
    let state = dir.join("state");
    // The first launch may use it (it is checked after the launch, in the background)...
    let cache = open(&writable, layered(&[&layer], &state));
    let (_, first) = process(cache.clone(), &mlp);
    assert_eq!(first.corrupt_found, 1, "{first:?}");
    // The note names the layer at fault, not the writable file.
    let note = cache.damage_note().unwrap();
    let (layer_name, writable_name) = (layer.display().to_string(), writable.display().to_string());
    assert!(
        note.contains(&format!("read-only layer {layer_name}"))
            && note.contains("is remembered")
            && !note.contains(&writable_name),
        "{note}"
    );
    drop(cache);
    // ...every later one repacks it into the writable file, then finds it there.
    for launch in 0..2 {
        let cache = open(&writable, layered(&[&layer], &state));
        let (out, stats) = process(cache, &mlp);
        assert_eq!(stats.hits + stats.packed, 3, "{stats:?}");
        assert_eq!(
            stats.packed,
            usize::from(launch == 0),
            "launch {launch}: {stats:?}"
        );
        assert_matches_reference(&mlp, &out);
    }
    assert_eq!(entries_in(&writable), 1);
    assert_eq!(
        std::fs::read(&layer).unwrap(),
        bytes,
        "the layer is never written"
    );
}

#[test]
fn layers_that_are_missing_not_regular_or_not_caches_are_ignored_and_said() {
    let dir = scratch("layers-bad");
    let not_a_cache = dir.join("text.xbc");
    std::fs::write(&not_a_cache, b"not a cache file at all, but long enough to have a header and a trailer of the format, so the magic is what fails it......................................................................................................................").unwrap();
    let missing = dir.join("missing.xbc");
    let mlp = model(6);
    let writable = dir.join("writable.xbc");
    let cache = open(
        &writable,
        layered(
            &[&missing, &not_a_cache, &dir.join("empty-dir")],
            &dir.join("state"),
        ),
    );
    let outcomes = cache.layer_outcomes();
    assert!(
        matches!(outcomes[0], LayerOutcome::Unreadable { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(
            outcomes[1],
            LayerOutcome::Ignored {
                why: format::FileError::BadMagic,
                ..
            }
        ),
        "{outcomes:?}"
    );
    assert_eq!(cache.layer_note().unwrap().lines().count(), 3);
    let (out, stats) = process(cache, &mlp);
    assert_eq!(stats.packed, 3);
    assert_matches_reference(&mlp, &out);
}

#[test]
fn a_directory_of_many_junk_files_is_one_note_that_counts_them() {
    let dir = scratch("layers-junk");
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    const JUNK: usize = 5000;
    for i in 0..JUNK {
        std::fs::write(bundle.join(format!("junk-{i:04}.xbc")), format!("junk {i}")).unwrap();
    }
    // And one that cannot be read as a file: a directory named as a cache file (the first by
    // name, so the note shows it).
    std::fs::create_dir_all(bundle.join("a-directory.xbc")).unwrap();
    let mlp = model(6);
    let cache = open(
        &dir.join("writable.xbc"),
        layered(&[&bundle], &dir.join("state")),
    );
    let outcomes = cache.layer_outcomes();
    assert!(
        matches!(
            outcomes,
            [LayerOutcome::UnusableInDirectory { files, .. }] if *files == JUNK + 1
        ),
        "{outcomes:?}"
    );
    let note = cache.layer_note().unwrap();
    assert_eq!(note.lines().count(), 1, "{note}");
    assert!(
        note.contains("5001 files") && note.contains("a-directory.xbc"),
        "{note}"
    );
    let (out, stats) = process(cache, &mlp);
    assert_eq!(stats.packed, 3);
    assert_matches_reference(&mlp, &out);
}

/// A damaged layer at `dir/damaged.xbc` of `mlp`, its bytes as damaged.
fn damaged_layer(dir: &Path, mlp: &Mlp) -> (std::path::PathBuf, Vec<u8>) {
    let layer = dir.join("damaged.xbc");
    make_layer(&layer, mlp, CacheOptions::default());
    let mut bytes = std::fs::read(&layer).unwrap();
    // Enough of the first entry's packed floats that its outputs are far off where it is used.
    for b in &mut bytes[format::HEADER_SIZE + 64..format::HEADER_SIZE + 192] {
        *b ^= 0x40;
    }
    std::fs::write(&layer, &bytes).unwrap();
    (layer, bytes)
}

/// Launches thrice with `layer` under a writable file and the state directory `state`, each
/// after `before_each`; every launch's outputs must be right: damage that cannot be remembered
/// is checked for before use.
fn every_launch_is_right(
    dir: &Path,
    layer: &Path,
    state: &Path,
    mlp: &Mlp,
    before_each: impl Fn(),
) {
    let writable = dir.join("writable.xbc");
    for launch in 0..3 {
        before_each();
        let cache = open(&writable, layered(&[layer], state));
        let (out, stats) = process(cache.clone(), mlp);
        assert_matches_reference(mlp, &out);
        assert_eq!(stats.hits + stats.packed, 3, "launch {launch}: {stats:?}");
        if let Some(note) = cache.damage_note() {
            assert!(!note.contains("is remembered"), "launch {launch}: {note}");
            assert!(
                note.contains(&layer.display().to_string()) && !note.contains("writable.xbc"),
                "launch {launch}: {note}"
            );
        }
    }
}

#[test]
fn a_damaged_layer_whose_damage_cannot_be_remembered_is_checked_before_use() {
    let dir = scratch("layers-unremembered");
    let mlp = model(7);
    let (layer, bytes) = damaged_layer(&dir, &mlp);
    std::thread::sleep(xnnblob::cache::SETTLED);
    // The state directory is there, but its record of this layer is a FIFO: nothing can be
    // written there, and it is never opened as a record.
    let record = fifo_at_damage_record(&dir.join("state"), &layer);
    every_launch_is_right(&dir, &layer, &dir.join("state"), &mlp, || {});
    assert!(
        std::fs::symlink_metadata(&record)
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO is left as it is"
    );
    assert_eq!(
        std::fs::read(&layer).unwrap(),
        bytes,
        "the layer is never written"
    );
}

#[test]
fn a_damaged_layer_changed_within_its_settle_time_is_checked_before_use() {
    let dir = scratch("layers-unsettled");
    let mlp = model(8);
    let (layer, bytes) = damaged_layer(&dir, &mlp);
    let (writable, state) = (dir.join("writable.xbc"), dir.join("state"));
    let settle = xnnblob::cache::settle_time(&layer);
    // Its change time is moved before each launch (the same bytes written again): a record made
    // after the launch could not tell a later change, so none is made and none is relied on.
    // Only a launch that opened the layer within its settle time is one: on a loaded host the
    // open may come later, when the change has settled and a check after use is the rule (the
    // damage then served once, and remembered). Those are tried again, not counted.
    let (mut counted, mut tries) = (0, 0);
    while counted < 3 {
        tries += 1;
        assert!(
            tries <= 100,
            "no launch opened the layer within its settle time ({settle:?}) in 100 tries:              this host is too loaded to run this test"
        );
        std::fs::write(&layer, &bytes).unwrap();
        let cache = open(&writable, layered(&[&layer], &state));
        if !changed_within(&layer, settle) {
            continue;
        }
        let (out, stats) = process(cache.clone(), &mlp);
        assert_matches_reference(&mlp, &out);
        assert_eq!(stats.hits + stats.packed, 3, "launch {counted}: {stats:?}");
        if let Some(note) = cache.damage_note() {
            assert!(!note.contains("is remembered"), "launch {counted}: {note}");
            assert!(
                note.contains(&layer.display().to_string()) && !note.contains("writable.xbc"),
                "launch {counted}: {note}"
            );
        }
        counted += 1;
    }
}

/// Whether `path` changed less than `settle` ago: a cache opened before this returned true
/// decided what to do with the file within its settle time.
fn changed_within(path: &Path, settle: std::time::Duration) -> bool {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    let changed = std::time::UNIX_EPOCH
        + std::time::Duration::new(meta.ctime() as u64, meta.ctime_nsec() as u32);
    std::time::SystemTime::now()
        .duration_since(changed)
        .is_ok_and(|age| age < settle)
}

#[test]
fn a_layer_entry_of_the_wrong_size_is_packed_once_into_the_writable_file() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch("layers-wrong-size");
    let layer = dir.join("lying.xbc");
    let mlp = model(9);
    make_layer(&layer, &mlp, CacheOptions::default());
    // One entry's size cut short, every checksum recomputed: consistent, and lying.
    let bytes = std::fs::read(&layer).unwrap();
    let compat = format::Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: cpu_fingerprint(),
    };
    let decoded = format::decode(&bytes, &compat).unwrap();
    let mut entries = decoded.entries.clone();
    entries[0].size -= 64;
    let crafted = format::reindexed(&bytes, &entries, &decoded.sources).unwrap();
    std::fs::write(&layer, crafted).unwrap();

    let writable = dir.join("writable.xbc");
    let state = dir.join("state");
    let mut inode = None;
    for launch in 0..3 {
        let (out, stats) = process(open(&writable, layered(&[&layer], &state)), &mlp);
        assert_matches_reference(&mlp, &out);
        assert_eq!(
            stats.packed,
            usize::from(launch == 0),
            "launch {launch}: {stats:?}"
        );
        // Written once, by the launch that packed; never again.
        let now = std::fs::metadata(&writable).unwrap().ino();
        assert_eq!(
            *inode.get_or_insert(now),
            now,
            "launch {launch} rewrote the file"
        );
    }
    assert_eq!(entries_in(&writable), 1, "one entry, its key once");
}

/// Issue 62: a layer cut short while a runtime has its packed weights mapped is named as the
/// file at fault, not the writable cache file, which nothing touched.
#[test]
fn a_layer_cut_short_while_mapped_is_the_file_the_error_names() {
    let dir = scratch("layer-cut-short");
    let bundle = dir.join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let mlp = model(11);
    let layer = bundle.join("model.xbc");
    make_layer(&layer, &mlp, CacheOptions::default());
    let writable = dir.join("writable.xbc");
    let cache = open(&writable, layered(&[&bundle], &dir.join("state")));
    let registrations = common::register_mlps(&cache, &[&mlp]);
    let graph = mlp.subgraph(1).unwrap();
    let before = cache.lost_maps();
    let mut runtime = Runtime::new(&graph, Some(&*cache)).unwrap();
    drop(registrations);
    cache.finalize().unwrap();
    assert_eq!(cache.stats().hits, 3, "served by the layer");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&layer)
        .unwrap();
    file.set_len(0).unwrap();
    let input = vec![0.5f32; mlp.input_width()];
    let mut out = vec![f32::NAN; mlp.output_width()];
    // Reads the packed weights past the layer's new end (zeros, not SIGBUS).
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    match cache.check_maps(before) {
        Err(xnnblob::cache::CacheError::Truncated { path }) => {
            assert_eq!(path.file_name(), layer.file_name(), "{}", path.display());
            assert!(path.starts_with(bundle.canonicalize().unwrap()) || path.starts_with(&bundle));
        }
        other => panic!("the cut was not reported: {other:?}"),
    }
    drop(runtime);
}
