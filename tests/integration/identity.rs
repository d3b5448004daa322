//! What a packed weight is found by (issue 38): everything it was packed from, not its bytes
//! alone. ExecuTorch exports (`tests/data/executorch/export/id_*`, from
//! scripts/export-executorch-fixtures.py) whose layers share bytes in other shapes, or beside other
//! biases, run in xnnblob's executor with no cache file, cold and warm, and match ExecuTorch's
//! own outputs; the same bytes in two shapes are two entries of the file. The drop-in
//! (faces/executorch's tests) and `xnnblob run` (cli/tests) run them too; the C ABI's side is in
//! faces/capi's tests.

use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::{BlobId, Compat, PackedWeightsCache, format};
use xnnblob::xnn::{LookUpKey, PackedWeightsProvider};

use crate::common;

/// The exports whose constants share bytes: a layer and its transposed twin (fp32, and 8da4w
/// where the twin's packing read past a heap buffer), zero-initialised layers of two shapes and
/// zero heads that differ only in their biases (fp32, 8da4w, and 8da8w, whose look-up key names
/// no bias).
const PROGRAMS: [&str; 5] = [
    "id_transposed_twins_fp32",
    "id_transposed_twins_8da4w",
    "id_zero_init_fp32",
    "id_zero_init_8da4w",
    "id_zero_init_8da8w",
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/export")
}

fn tolerance(name: &str) -> f32 {
    if name.ends_with("fp32") { 1e-5 } else { 1e-3 }
}

/// Loads `name` through `backend` (with `cache`, if any), runs its steps and returns the worst
/// difference from ExecuTorch's outputs, as a fraction of their range.
fn run(backend: &Backend, name: &str, cache: Option<&WeightsCacheChoice>) -> f32 {
    let io = common::io_steps::io(&dir(), name);
    let program = common::io_steps::load(backend, &dir(), &io, name, cache);
    let mut method = program
        .method(io["method"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    common::io_steps::run_steps(&dir(), &io, &mut method, name, true)
}

fn new_backend() -> Backend {
    Backend::new(BackendOptions {
        threads: 2,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn the_same_bytes_in_two_shapes_or_beside_two_biases_give_executorchs_outputs_without_a_cache_file()
{
    for name in PROGRAMS {
        let worst = run(&new_backend(), name, None);
        assert!(
            worst <= tolerance(name),
            "{name}: {worst} of the range from ExecuTorch's outputs"
        );
    }
}

#[test]
fn the_same_bytes_in_two_shapes_or_beside_two_biases_give_executorchs_outputs_cold_and_warm() {
    let scratch = common::scratch("identity-cold-warm");
    for name in PROGRAMS {
        let path = scratch.join(format!("{name}.xbc"));
        let cache = WeightsCacheChoice::File(path.clone());
        for launch in ["cold", "warm"] {
            // A backend per launch: a new process's view of the file.
            let backend = new_backend();
            let worst = run(&backend, name, Some(&cache));
            assert!(
                worst <= tolerance(name),
                "{name} {launch}: {worst} of the range from ExecuTorch's outputs"
            );
            let file = backend.file_cache(&path).unwrap();
            file.wait_saved().unwrap();
            let stats = file.stats();
            if launch == "warm" {
                assert_eq!(
                    stats.packed, 0,
                    "{name}: a warm launch packs nothing: {stats:?}"
                );
                assert_eq!(stats.wrong_size, 0, "{name}: {stats:?}");
            } else {
                assert!(stats.packed > 0, "{name}: a cold launch packs: {stats:?}");
            }
        }
    }
}

#[test]
fn a_layer_and_its_transposed_twin_are_two_entries_of_the_file() {
    // Both layers' weights are one constant (ExecuTorch names it by the sha256 of its bytes),
    // packed in two shapes: two entries, of two sizes, neither keyed by the bytes' hash alone.
    let scratch = common::scratch("identity-twins");
    let path = scratch.join("twins.xbc");
    let backend = new_backend();
    let name = "id_transposed_twins_fp32";
    run(
        &backend,
        name,
        Some(&WeightsCacheChoice::File(path.clone())),
    );
    backend.file_cache(&path).unwrap().wait_saved().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let compat = Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    };
    let mut decoded = format::decode(&bytes, &compat).unwrap();
    // Packed weights only (not the delegate's kept identities, nor kept constants).
    decoded.entries.retain(|e| !e.key.keeps_constant());
    // a [64, 128], b [128, 64], c [64, 128] with a bias: three packings of one constant.
    assert_eq!(decoded.entries.len(), 3, "{:?}", decoded.entries);
    let kernels: std::collections::HashSet<BlobId> =
        decoded.entries.iter().map(|e| e.key.kernel).collect();
    assert_eq!(kernels.len(), 3, "three identities: {kernels:?}");
    let sizes: std::collections::HashSet<u64> = decoded.entries.iter().map(|e| e.size).collect();
    assert!(
        sizes.len() >= 2,
        "the shapes pack to other sizes: {sizes:?}"
    );
}

/// A registered weight packed under one key, then looked up by an operator that reads another
/// number of bytes: the entry is not returned, and is forgotten.
#[test]
fn an_entry_of_another_size_than_the_operator_reads_is_a_miss_and_is_forgotten() {
    let cache = PackedWeightsCache::in_memory();
    let kernel = vec![3u8; 4096];
    let _registration = cache.register(&kernel, BlobId::of_bytes(&kernel));
    let key = |packed_size| LookUpKey {
        seed: 11,
        kernel: kernel.as_ptr().cast(),
        bias: std::ptr::null(),
        packed_size,
    };
    let packed = cache.reserve_space(1024).unwrap();
    let offset = cache.look_up_or_insert(&key(1024), Some(packed), 1024);
    assert!(offset.is_some());
    assert_eq!(cache.look_up(&key(1024)), offset, "the right size is a hit");
    assert_eq!(cache.look_up(&key(2048)), None, "another size is a miss");
    assert_eq!(cache.stats().wrong_size, 1);
    // Forgotten: not even the size it holds finds it now; a repack takes its place.
    assert_eq!(cache.look_up(&key(1024)), None);
    let repacked = cache.reserve_space(2048).unwrap();
    let again = cache.look_up_or_insert(&key(2048), Some(repacked), 2048);
    assert!(again.is_some() && again != offset);
    assert_eq!(cache.look_up(&key(2048)), again);
    // A confirmation with a null pointer (XNNPACK's convolution path) is checked the same way.
    assert_eq!(cache.look_up_or_insert(&key(4096), None, 4096), None);
}

#[test]
fn an_address_holds_one_identity_at_a_time() {
    let cache = PackedWeightsCache::in_memory();
    let bytes = vec![0u8; 256];
    let buffer = {
        let mut map = xnnblob::named_data::InMemoryMap::new("zeros");
        map.insert("z", &bytes, 64, None).unwrap();
        xnnblob::named_data::NamedDataMap::get_data(&map, "z").unwrap()
    };
    let first = BlobId::of_bytes(b"[16, 4]");
    let second = BlobId::of_bytes(b"[4, 16]");
    let held = cache.register_owned(buffer.clone(), first).unwrap();
    assert!(
        cache.register_owned(buffer.clone(), first).is_some(),
        "the same identity again shares the address"
    );
    assert!(
        cache.register_owned(buffer.clone(), second).is_none(),
        "another identity is refused while the first is registered"
    );
    assert!(!cache.register_raw(buffer.as_ptr(), second));
    drop(held);
    assert!(
        cache.register_raw(buffer.as_ptr(), second),
        "free again once unregistered"
    );
    cache.unregister_raw(buffer.as_ptr());
    // A delegate's registrations, ended together: the address is free only once all have.
    let held: Vec<_> = (0..3)
        .map(|_| cache.register_owned(buffer.clone(), first).unwrap())
        .collect();
    assert!(!cache.register_raw(buffer.as_ptr(), second));
    xnnblob::cache::OwnedRegistration::end_all(held);
    assert!(
        cache.register_raw(buffer.as_ptr(), second),
        "free again once every registration ended"
    );
    cache.unregister_raw(buffer.as_ptr());
}

#[test]
fn an_address_registered_under_two_identities_is_found_by_neither() {
    // The Rust API's borrowed registrations cannot be refused: the address becomes ambiguous.
    let cache = PackedWeightsCache::in_memory();
    let kernel = vec![5u8; 512];
    let key = LookUpKey {
        seed: 3,
        kernel: kernel.as_ptr().cast(),
        bias: std::ptr::null(),
        packed_size: 512,
    };
    let one = cache.register(&kernel, BlobId::of_bytes(b"one shape"));
    let packed = cache.reserve_space(512).unwrap();
    cache.look_up_or_insert(&key, Some(packed), 512).unwrap();
    assert!(cache.look_up(&key).is_some());
    let two = cache.register(&kernel, BlobId::of_bytes(b"another shape"));
    assert_eq!(cache.look_up(&key), None, "ambiguous: found by neither");
    // The first identity registered once more: ambiguous until the other goes, then the first's
    // two registrations hold it, one after the other.
    let three = cache.register(&kernel, BlobId::of_bytes(b"one shape"));
    assert_eq!(cache.look_up(&key), None, "still ambiguous");
    drop(two);
    assert!(cache.look_up(&key).is_some(), "one identity again");
    drop(one);
    assert!(
        cache.look_up(&key).is_some(),
        "held by its other registration"
    );
    drop(three);
    assert_eq!(cache.look_up(&key), None, "unregistered: not found");
    // Ambiguous the other way round: the first identity goes, and the address is the second's,
    // which has no packing of its own.
    let first = cache.register(&kernel, BlobId::of_bytes(b"one shape"));
    let second = cache.register(&kernel, BlobId::of_bytes(b"another shape"));
    drop(first);
    assert_eq!(
        cache.look_up(&key),
        None,
        "the second identity's, never the first's packing"
    );
    drop(second);
}

/// A fully connected layer whose filter is `filter` read as `[outputs, inputs]`, through `cache`;
/// its output for `input`.
fn fully_connected(
    cache: &PackedWeightsCache,
    filter: &[f32],
    outputs: usize,
    inputs: usize,
    input: &[f32],
) -> Vec<f32> {
    use xnnblob::xnn::{Datatype, Runtime, Subgraph, ValueRole};
    let mut g = Subgraph::new(2).unwrap();
    let x = g
        .define_tensor(Datatype::Fp32, &[1, inputs], ValueRole::Input(0))
        .unwrap();
    let w = g
        .define_tensor(
            Datatype::Fp32,
            &[outputs, inputs],
            ValueRole::static_f32(filter),
        )
        .unwrap();
    let y = g
        .define_tensor(Datatype::Fp32, &[1, outputs], ValueRole::Output(1))
        .unwrap();
    g.define_fully_connected(x, w, None, y, f32::NEG_INFINITY, f32::INFINITY)
        .unwrap();
    let mut runtime = Runtime::new(&g, Some(cache)).unwrap();
    cache.finalize().unwrap();
    let mut out = vec![f32::NAN; outputs];
    runtime.invoke(&[(0, input)], &mut [(1, &mut out)]).unwrap();
    out
}

/// What a C ABI caller does (`xnnblob_cache_register`: the bytes' identity only): one buffer
/// registered once, packed as [64, 128] and as [128, 64]. XNNPACK's seed, a hash of every
/// packing parameter since patch 0006 (it XOR-ed out ^ in before), tells the two apart.
#[test]
fn registered_by_bytes_alone_a_weight_and_its_transposed_twin_are_told_apart_by_the_seed() {
    let (n, k) = (64usize, 128usize);
    // XNNPACK may read a little past a filter: the buffer has room after it.
    let mut w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
        .collect();
    w.extend([0f32; 16]);
    let filter = &w[..n * k];
    let cache = PackedWeightsCache::in_memory();
    let _registration = cache.register(filter, BlobId::of_f32s(filter));
    let reference = |outputs: usize, inputs: usize, input: &[f32]| -> Vec<f32> {
        (0..outputs)
            .map(|o| (0..inputs).map(|i| filter[o * inputs + i] * input[i]).sum())
            .collect()
    };
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
    let y = fully_connected(&cache, filter, n, k, &x);
    let z_in: Vec<f32> = (0..n).map(|i| (i as f32 * 0.21).cos()).collect();
    let z = fully_connected(&cache, filter, k, n, &z_in);
    for (got, want, what) in [
        (y, reference(n, k, &x), "[64, 128]"),
        (z, reference(k, n, &z_in), "[128, 64]"),
    ] {
        assert_eq!(got.len(), want.len(), "{what}");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{what}: {worst} from the reference");
    }
    assert_eq!(cache.stats().packed, 2, "two packings of one buffer");
}
