//! The peer bench: `cargo bench --bench peer [-- OPTIONS]`, the options of `xnnblob bench
//! --peer` (see `xnnblob::bench::peer`). It launches `xnnblob-et-run` from the same target
//! directory: `cargo build --release --workspace` builds it.

fn main() {
    let result =
        xnnblob::bench::peer::runner_near_executable().and_then(xnnblob::bench::peer_bench_main);
    if let Err(e) = result {
        eprintln!("peer bench: {e}");
        std::process::exit(1);
    }
}
