//! Runtime creation time for a synthetic MLP: packing every weight (no cache), packing into an
//! in-memory provider, and finding every weight already packed there (the floor of any cache).
//! Prints the median and spread of each, and their ratio, measured in one run.

use std::time::Instant;
use xnnblob::xnn::{InMemoryProvider, ProvidedWeightsCache, Runtime};
use xnnblob_test_support::synthetic::Mlp;

const REPEATS: usize = 15;

fn summarize(name: &str, mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    println!(
        "{name:<40} median {median:9.3} ms   min {:9.3}   max {:9.3}",
        samples[0],
        samples[samples.len() - 1]
    );
    median
}

fn main() {
    let widths = [2048, 4096, 4096, 1024];
    let mlp = Mlp::random(&widths, 42);
    let graph = mlp.subgraph(1).expect("subgraph");
    let mib: usize = mlp
        .layers
        .iter()
        .map(|l| l.weights.len() * 4)
        .sum::<usize>()
        >> 20;
    println!("MLP {widths:?}: {mib} MiB fp32 weights, {REPEATS} repeats each");

    let time = |f: &dyn Fn()| {
        (0..REPEATS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect::<Vec<_>>()
    };
    let no_cache = summarize(
        "no cache (packs every weight)",
        time(&|| drop(Runtime::new(&graph, None).expect("runtime"))),
    );
    let cold = summarize(
        "in-memory cache, cold (packs into it)",
        time(&|| {
            let cache = ProvidedWeightsCache::new(InMemoryProvider::new());
            drop(Runtime::new(&graph, Some(&cache)).expect("runtime"));
        }),
    );
    let cache = ProvidedWeightsCache::new(InMemoryProvider::new());
    drop(Runtime::new(&graph, Some(&cache)).expect("runtime"));
    cache.finalize();
    let warm = summarize(
        "in-memory cache, every weight a hit",
        time(&|| drop(Runtime::new(&graph, Some(&cache)).expect("runtime"))),
    );
    println!("cold / no cache: {:.2}x", cold / no_cache);
    println!("no cache / hit:  {:.0}x", no_cache / warm);
}
