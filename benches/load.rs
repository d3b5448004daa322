//! The load benchmark: `cargo bench --bench load [-- OPTIONS]` (see `xnnblob bench --help`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = xnnblob::bench::main(&args, false) {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}
