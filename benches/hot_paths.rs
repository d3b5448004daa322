//! Criterion micro-benchmarks of the lookups a launch makes thousands of times: a key in a map
//! of 10k keys, a packed-weight `look_up` hit, a shared-data-cache hit.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use xnnblob::cache::{BlobId, PackedWeightsCache};
use xnnblob::named_data::{FileDataMap, NamedBlobStore, NamedDataMap};
use xnnblob::shared_data::SharedDataCache;
use xnnblob::xnn::{LookUpKey, PackedWeightsProvider};

fn map_of_10k() -> FileDataMap {
    let mut store = NamedBlobStore::new();
    for i in 0..10_000u32 {
        let bytes = i.to_le_bytes().repeat(4);
        store
            .add_named_blob(&format!("layers.{i}.weight"), &bytes, 16, "m", None)
            .unwrap();
    }
    FileDataMap::from_bytes(&store.serialize("m").unwrap(), None, "10k").unwrap()
}

fn key_lookup(c: &mut Criterion) {
    let map = map_of_10k();
    c.bench_function("named data: get_data in a map of 10k keys", |b| {
        let mut i = 0u32;
        b.iter(|| {
            i = (i + 7919) % 10_000;
            black_box(map.get_data(&format!("layers.{i}.weight")).unwrap());
        })
    });
}

fn look_up_hit(c: &mut Criterion) {
    let cache = PackedWeightsCache::in_memory();
    let kernel = vec![1u8; 4096];
    let _reg = cache.register(&kernel, BlobId::of_bytes(&kernel));
    let key = LookUpKey {
        seed: 7,
        kernel: kernel.as_ptr().cast(),
        bias: std::ptr::null(),
        packed_size: 4096,
    };
    let packed = cache.reserve_space(4096).unwrap();
    cache.look_up_or_insert(&key, Some(packed), 4096).unwrap();
    c.bench_function("packed-weight cache: look_up hit", |b| {
        b.iter(|| black_box(cache.look_up(black_box(&key)).unwrap()))
    });
}

fn shared_cache_hit(c: &mut Criterion) {
    let map = map_of_10k();
    let shared = SharedDataCache::new();
    let held = shared
        .get_or_init("layers.42.weight", || map.get_data("layers.42.weight"))
        .unwrap();
    c.bench_function("shared data cache: hit", |b| {
        b.iter(|| {
            black_box(
                shared
                    .get_or_init("layers.42.weight", || map.get_data("layers.42.weight"))
                    .unwrap(),
            )
        })
    });
    drop(held);
}

criterion_group!(benches, key_lookup, look_up_hit, shared_cache_hit);
criterion_main!(benches);
