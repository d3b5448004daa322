//! Parallel cold packing: with a thread pool, the weights a packed-weight cache lacks are packed
//! ahead of runtime creation on the backend's threads, so creation itself packs none; outputs
//! are bit-identical to packing inside creation, and a warm launch packs nothing ahead. Into a
//! cache file that held nothing, a small program's runtimes pack their own weights instead.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::{CacheOptions, HeapFirst, PackedWeightsCache};
use xnnblob::program::Program;

/// Programs with fully connected and convolution weights of every packing kind the fixtures
/// have: fp32, qd8 with 8-bit, 4-bit channelwise and blockwise weights, a CNN, two methods.
const PROGRAMS: &[(&str, bool)] = &[
    ("mlp_xnn_external", true),
    ("mlp_qd8_qc8w_external", true),
    ("mlp_qc4w_inline", false),
    ("mlp_qb4w_inline", false),
    ("cnn_xnn_external", true),
    ("two_methods_xnn_external", true),
];

fn files(name: &str, external: bool) -> (PathBuf, Vec<PathBuf>) {
    let dir = common::dir();
    let ptds = if external {
        vec![dir.join(format!("{name}.ptd"))]
    } else {
        Vec::new()
    };
    (dir.join(format!("{name}.pte")), ptds)
}

/// Packing into a draft of the cache file from the first byte (`HeapFirst(0)`), as a model
/// past its first 4 MiB of packed weights does.
fn backend(pack_serially: bool) -> Backend {
    Backend::new(BackendOptions {
        threads: 2,
        pack_serially,
        cache_options: CacheOptions {
            heap_first: HeapFirst(0),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap()
}

/// Deterministic inputs of every method's declared shapes.
fn inputs(program: &Program, method: &str) -> Vec<Vec<f32>> {
    program
        .input_shapes(method)
        .unwrap()
        .iter()
        .map(|shape| {
            let n: usize = shape.iter().product();
            (0..n).map(|i| ((i % 23) as f32 - 11.0) / 7.0).collect()
        })
        .collect()
}

struct Launch {
    outputs: Vec<Vec<Vec<f32>>>,
    /// Per delegate: (weights missing before creation, packed ahead, packed by creation).
    delegates: Vec<(usize, usize, usize)>,
}

fn launch(backend: &Backend, name: &str, external: bool, cache: Option<&Path>) -> Launch {
    let (pte, ptds) = files(name, external);
    let cache = cache.map(|p| WeightsCacheChoice::File(p.to_path_buf()));
    let program = Program::load(backend, &pte, &ptds, cache.as_ref()).unwrap();
    let mut outputs = Vec::new();
    let mut delegates = Vec::new();
    for method in program.method_names() {
        let mut m = program.method(method).unwrap();
        for d in m.delegates() {
            let t = d.init_timings();
            delegates.push((
                t.prepacked.missing,
                t.prepacked.packed,
                t.packed_at_creation,
            ));
        }
        let data = inputs(&program, method);
        let refs: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
        outputs.push(m.execute_f32(&refs).unwrap());
    }
    Launch { outputs, delegates }
}

fn same_bits(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> bool {
    let bits = |x: &[Vec<Vec<f32>>]| -> Vec<u32> {
        x.iter().flatten().flatten().map(|v| v.to_bits()).collect()
    };
    bits(a) == bits(b)
}

/// Makes the cache file at `path` hold another program's packed weights than `name`'s: a launch
/// of `name` that opens it packs ahead, as every cold launch does but one whose cache file held
/// nothing (there a small program's runtimes pack their own weights, as the test below holds).
fn seed(path: &Path, name: &str) {
    let (other, external) = PROGRAMS
        .iter()
        .copied()
        .find(|&(n, _)| n != name)
        .expect("two programs");
    let b = backend(false);
    launch(&b, other, external, Some(path));
    b.file_cache(path).unwrap().wait_saved().unwrap();
}

#[test]
fn a_cold_launch_packs_every_weight_ahead_and_runtime_creation_packs_none() {
    let dir = common::scratch("parallel-packing-cold");
    for &(name, external) in PROGRAMS {
        let serial = launch(&backend(true), name, external, None);
        assert!(
            serial.delegates.iter().all(|&(missing, _, _)| missing == 0),
            "{name}: packing ahead ran although serial packing was asked for"
        );
        let path = dir.join(format!("{name}.cache"));
        seed(&path, name);
        let parallel_backend = backend(false);
        let parallel = launch(&parallel_backend, name, external, Some(&path));
        let packed_ahead: usize = parallel.delegates.iter().map(|d| d.1).sum();
        assert!(packed_ahead > 0, "{name}: nothing was packed ahead");
        for (i, &(missing, packed, _)) in parallel.delegates.iter().enumerate() {
            assert_eq!(
                missing, packed,
                "{name}, delegate {i}: packing ahead failed"
            );
        }
        let at_creation: usize = parallel.delegates.iter().map(|d| d.2).sum();
        assert_eq!(
            at_creation,
            // XNNPACK packs depthwise filters through the cache (patch 0025) but may read them
            // as they are too: the runtime's creation packs them, not packing ahead.
            common::delegate_nodes(&files(name, external).0, &["XNNDepthwiseConv2d"]),
            "{name}: creation packed weights besides the depthwise ones"
        );
        let cache = parallel_backend.file_cache(&path).unwrap();
        assert_eq!(cache.stats().packed, packed_ahead + at_creation, "{name}");
        assert!(
            same_bits(&serial.outputs, &parallel.outputs),
            "{name}: outputs differ from packing inside creation"
        );
    }
}

#[test]
fn into_an_empty_cache_runtimes_pack_a_small_program_and_a_warm_launch_packs_nothing() {
    let dir = common::scratch("parallel-packing-warm");
    for &(name, external) in PROGRAMS {
        let serial = launch(&backend(true), name, external, None);
        let path = dir.join(format!("{name}.cache"));
        let cold_backend = backend(false);
        let cold = launch(&cold_backend, name, external, Some(&path));
        // The file held nothing: each delegate's runtime packs its weights in its creation,
        // none ahead, no placeholder read in, the outputs those of packing serially.
        assert!(
            cold.delegates
                .iter()
                .all(|&(missing, packed, _)| (missing, packed) == (0, 0)),
            "{name}: a small program packed ahead into an empty cache: {:?}",
            cold.delegates
        );
        let at_creation: usize = cold.delegates.iter().map(|d| d.2).sum();
        let stats = cold_backend.file_cache(&path).unwrap().stats();
        assert!(at_creation > 0, "{name}: nothing was packed");
        assert_eq!(stats.packed, at_creation, "{name}");
        assert_eq!(stats.deferred_fills, 0, "{name}: a placeholder was read in");
        assert!(same_bits(&serial.outputs, &cold.outputs), "{name}");
        cold_backend
            .file_cache(&path)
            .unwrap()
            .wait_saved()
            .unwrap();
        drop(cold_backend);
        let warm_backend = backend(false);
        let warm = launch(&warm_backend, name, external, Some(&path));
        assert!(
            warm.delegates.iter().all(|&d| d == (0, 0, 0)),
            "{name}: a warm launch packed: {:?}",
            warm.delegates
        );
        assert_eq!(
            warm_backend.file_cache(&path).unwrap().stats().packed,
            0,
            "{name}"
        );
        assert!(same_bits(&cold.outputs, &warm.outputs), "{name}");
    }
}

#[test]
fn eight_threads_loading_one_program_cold_share_one_packing_of_each_weight() {
    let dir = common::scratch("parallel-packing-threads");
    let (name, external) = ("mlp_qd8_qc8w_external", true);
    let serial = launch(&backend(true), name, external, None);
    let path = dir.join("shared.cache");
    let shared = backend(false);
    let results: Vec<Launch> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| launch(&shared, name, external, Some(&path))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert!(same_bits(&serial.outputs, &r.outputs));
    }
    let cache: Arc<PackedWeightsCache> = shared.file_cache(&path).unwrap();
    let stats = cache.stats();
    // Each weight is kept once however many threads packed it at the same time.
    let unique = launch(&backend(false), name, external, None);
    let per_launch: usize = unique.delegates.iter().map(|d| d.1).sum();
    assert_eq!(stats.entries, per_launch, "{stats:?}");
}

#[test]
fn a_cold_launch_publishes_the_file_it_packed_into_in_packing_order() {
    // Packed ahead on two threads, largest first, straight into a draft of the file: the save
    // publishes that draft as it is, each weight where it was packed, rather than writing the
    // bytes a second time in graph order. (A warm launch from a cold page cache reads the whole
    // file ahead on a thread of its own; see `CacheOptions::prefetch`.)
    use xnnblob::cache::{Compat, format};
    use xnnblob_test_support::builder::GraphBuilder;
    let dir = common::scratch("parallel-packing-order");
    // Each layer larger than the one before: packing ahead takes the largest first. 1.6 Mi
    // elements in all, past what one thread packs alone.
    let mut g = GraphBuilder::new();
    let mut x = g.input(&[1, 48]);
    let expected = 12;
    for layer in 0..expected as u32 {
        let (inputs, outputs) = (48 * (layer + 1), 48 * (layer + 2));
        let w: Vec<f32> = (0..inputs * outputs)
            .map(|i| ((i * 7 + layer * 13) % 31) as f32 / 31.0 - 0.5)
            .collect();
        let wv = g.constant_f32(&[outputs, inputs], &w);
        x = g.fully_connected(x, wv, None, f32::NEG_INFINITY, f32::INFINITY);
    }
    g.output(x);
    let built = g.finish();
    let (pte, ptd) = (dir.join("chain.pte"), dir.join("chain.ptd"));
    built.write_pte(&pte, "forward").unwrap();
    built.write_ptd(&ptd).unwrap();

    let path = dir.join("chain.cache");
    let backend = backend(false);
    let cache = WeightsCacheChoice::File(path.clone());
    let program = Program::load(&backend, &pte, &[ptd], Some(&cache)).unwrap();
    let method = program.method("forward").unwrap();
    let threads: Vec<usize> = method
        .delegates()
        .iter()
        .map(|d| d.init_timings().prepacked.threads)
        .collect();
    assert_eq!(
        threads,
        [2],
        "packed ahead on both of the backend's threads"
    );
    drop(method);
    let file_cache = backend.file_cache(&path).unwrap();
    file_cache.wait_saved().unwrap();
    assert_eq!(file_cache.stats().packed, expected);

    let bytes = std::fs::read(&path).unwrap();
    let compat = Compat {
        build_id: xnnblob::xnn::build_identifier().to_vec(),
        cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
    };
    let decoded = format::decode(&bytes, &compat).unwrap();
    assert!(
        decoded.entries.windows(2).all(|w| w[0].key < w[1].key),
        "the published draft lists its entries in key order"
    );
    // Identities cover shapes as well as bytes, so the file is read by size: each layer's
    // packing is larger than the one before it. Packing ahead hands the layers out largest
    // first, and each of the two threads reserves its regions in the order it was handed them,
    // so the file, in packing order, is two descending runs interleaved however the threads were
    // scheduled: no three entries grow in size. In graph order (the bytes written again) all
    // twelve would.
    // (The index lists them by key: their regions are read by offset.)
    let mut weights: Vec<&format::FileEntry> = decoded
        .entries
        .iter()
        .filter(|e| !e.key.keeps_constant())
        .collect();
    weights.sort_by_key(|e| e.offset);
    let in_file: Vec<u64> = weights.iter().map(|e| e.size).collect();
    assert_eq!(in_file.len(), expected);
    assert!(
        longest_growing_run(&in_file) <= 2,
        "file order is packing order on two threads: sizes {in_file:?}"
    );
}

/// The length of the longest subsequence of `sizes` that grows strictly: the least number of
/// non-growing subsequences `sizes` splits into.
fn longest_growing_run(sizes: &[u64]) -> usize {
    // Patience sorting: tails[k] is the least last element of a growing subsequence of k + 1.
    let mut tails: Vec<u64> = Vec::new();
    for &s in sizes {
        match tails.binary_search(&s) {
            Ok(_) => {}
            Err(at) if at == tails.len() => tails.push(s),
            Err(at) => tails[at] = s,
        }
    }
    tails.len()
}

#[test]
fn longest_growing_run_counts_what_it_says() {
    assert_eq!(longest_growing_run(&[]), 0);
    assert_eq!(longest_growing_run(&[5, 4, 3]), 1);
    assert_eq!(longest_growing_run(&[5, 9, 4, 8, 3, 7]), 2);
    assert_eq!(longest_growing_run(&[1, 2, 3, 4]), 4);
    // The fresh-machine check's run: one thread held a layer while the other packed four.
    let run = [
        172928, 135936, 123648, 92800, 82560, 57856, 31104, 24960, 12544, 8448, 49664, 2176,
    ];
    assert_eq!(longest_growing_run(&run), 2);
}
