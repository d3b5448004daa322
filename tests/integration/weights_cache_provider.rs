//! A weights-cache provider written in Rust, driven by real XNNPACK through its six callbacks.

use crate::common;

use xnnblob::xnn::{InMemoryProvider, ProvidedWeightsCache, Runtime, Status};
use xnnblob_test_support::synthetic::{MLP_INPUT, MLP_OUTPUT, Mlp};

fn run(runtime: &mut Runtime<'_>, input: &[f32], outputs: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; outputs];
    runtime
        .invoke(&[(MLP_INPUT, input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    out
}

#[test]
fn first_runtime_packs_each_weight_once_and_second_runtime_packs_nothing() {
    let mlp = Mlp::random(&[32, 48, 40, 16], 3);
    let input: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 16.0).collect();
    let cache = ProvidedWeightsCache::new(InMemoryProvider::new());
    let graph = mlp.subgraph(1).unwrap();

    let mut first = Runtime::new(&graph, Some(&cache)).unwrap();
    let packed = cache.stats();
    assert_eq!(packed.reserve_space_calls, 3, "one packing per layer");
    assert_eq!(packed.look_up_or_insert_calls, 3);
    assert_eq!(packed.entries, 3);
    assert_eq!(packed.look_up_misses, 3);
    cache.finalize();
    let out_first = run(&mut first, &input, 16);

    let mut second = Runtime::new(&graph, Some(&cache)).unwrap();
    let after = cache.stats();
    assert_eq!(
        after.reserve_space_calls, 3,
        "second runtime reserved nothing"
    );
    assert_eq!(after.look_up_or_insert_calls, 3);
    assert_eq!(after.look_up_hits, 3);
    let out_second = run(&mut second, &input, 16);

    assert_eq!(out_first, out_second);
    let reference = mlp.reference_forward(&input, 1);
    assert_eq!(out_first.len(), reference.len());
    common::close::assert_close(
        &out_first,
        &reference,
        common::close::Tolerance::Absolute(1e-4),
        "the MLP",
    );
}

#[test]
fn setup_before_the_cache_is_finalized_is_an_invalid_state_error() {
    let mlp = Mlp::random(&[16, 8, 8, 4], 5);
    let cache = ProvidedWeightsCache::new(InMemoryProvider::new());
    let graph = mlp.subgraph(1).unwrap();
    let mut runtime = Runtime::new(&graph, Some(&cache)).unwrap();
    let input = vec![0.25f32; 16];
    let mut out = vec![0f32; 4];
    let err = runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidState), "{err}");
    // Once finalized, the very same runtime sets up and runs.
    cache.finalize();
    runtime
        .invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut out)])
        .unwrap();
    assert!(out.iter().all(|v| v.is_finite()));
}

#[test]
fn runtimes_on_several_threads_share_one_cache() {
    let mlp = Mlp::random(&[64, 64, 64, 8], 11);
    let input: Vec<f32> = (0..64).map(|i| (i as f32).sin()).collect();
    let cache = ProvidedWeightsCache::new(InMemoryProvider::new());
    let graph = mlp.subgraph(1).unwrap();
    drop(Runtime::new(&graph, Some(&cache)).unwrap());
    cache.finalize();
    let expected = mlp.reference_forward(&input, 1);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let graph = mlp.subgraph(1).unwrap();
                let mut rt = Runtime::new(&graph, Some(&cache)).unwrap();
                let out = run(&mut rt, &input, 8);
                for (a, b) in out.iter().zip(&expected) {
                    assert!((a - b).abs() <= 1e-4);
                }
            });
        }
    });
    let stats = cache.stats();
    assert_eq!(
        stats.reserve_space_calls, 3,
        "threads found every weight packed"
    );
    assert_eq!(stats.look_up_hits, 12);
}

/// XNNPACK packs into what a cache hands out without zeroing it first where the cache says its
/// reservations are zero (patch 0037): every reservation of xnnblob's caches, on the heap, in a
/// draft of the file and in memory, reads zero, however the ones before it were written and
/// whether they were adopted or abandoned.
#[test]
fn every_reservation_reads_zero_however_the_ones_before_it_were_written() {
    use xnnblob::cache::{BlobId, CacheOptions, HeapFirst, PackedWeightsCache};
    use xnnblob::xnn::{LookUpKey, PackedWeightsProvider};
    let dir = common::scratch("zeroed-reservations");
    let drafted = CacheOptions {
        heap_first: HeapFirst(0),
        ..Default::default()
    };
    let heap = PackedWeightsCache::open(dir.join("heap.xbc")).unwrap();
    let draft = PackedWeightsCache::open_with(dir.join("draft.xbc"), drafted).unwrap();
    let memory = InMemoryProvider::new();
    let providers: [(&str, &dyn PackedWeightsProvider); 3] =
        [("heap", &*heap), ("draft", &*draft), ("memory", &memory)];
    let kernels: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 256]).collect();
    let _registered: Vec<_> = [&heap, &draft]
        .iter()
        .flat_map(|cache| {
            kernels
                .iter()
                .map(|k| cache.register(k, BlobId::of_bytes(k)))
                .collect::<Vec<_>>()
        })
        .collect();
    for (name, provider) in providers {
        assert!(provider.reserves_zeroed(), "{name}");
        for (i, n) in [64usize, 4096, 100_032, 1 << 20, 64, 3 << 20, 4096, 192]
            .into_iter()
            .enumerate()
        {
            let region = provider.reserve_space(n).unwrap();
            // SAFETY: a reservation is `n` writable bytes until it is adopted (or the provider
            // is dropped); nothing else writes them meanwhile.
            let bytes = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), n) };
            assert!(
                bytes.iter().all(|&b| b == 0),
                "{name}: reservation {i} of {n} bytes is not zero"
            );
            bytes.fill(0xA5);
            // Every other one adopted as a packed weight; the rest abandoned.
            if i % 2 == 0 {
                let key = LookUpKey {
                    seed: 1,
                    kernel: kernels[i].as_ptr().cast(),
                    bias: std::ptr::null(),
                    packed_size: n,
                };
                assert!(provider.look_up_or_insert(&key, Some(region), n).is_some());
            }
        }
    }
}
