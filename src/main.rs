//! The `xnnblob` command line.

use std::process::ExitCode;
use std::time::Instant;
use xnnblob::named_data::FileDataMap;
use xnnblob::synthetic::{Mlp, MLP_INPUT, MLP_OUTPUT};
use xnnblob::xnn::{self, InMemoryWeightsCache, Runtime, WeightsCache};

const USAGE: &str = "\
usage: xnnblob [demo]
       xnnblob inspect FILE [--json] [--sha256]
       xnnblob cache stats|verify|compact PATH

commands:
  demo     build a 3-layer MLP in XNNPACK, run it, print its output and timings (the default)
  inspect  list the keys, segments (size, alignment) and tensor layouts of a .ptd or .pte;
           --json prints one JSON object, --sha256 adds each blob's sha256
  cache    a packed-weight cache file: stats (header and index only), verify (checksums every
           packed weight and drops bad entries so the next launch repacks them; exit 1 if any),
           compact (rewrites only the valid entries, tightly)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None | Some("demo") => demo(),
        Some("inspect") => inspect(&args[1..]),
        Some("cache") => cache_command(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command '{other}'\n{USAGE}").into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xnnblob: {e}");
            ExitCode::FAILURE
        }
    }
}

fn inspect(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let (mut json, mut sha, mut file) = (false, false, None);
    for a in args {
        match a.as_str() {
            "--json" => json = true,
            "--sha256" => sha = true,
            flag if flag.starts_with("--") => {
                return Err(format!("unknown option {flag}\n{USAGE}").into())
            }
            path if file.is_none() => file = Some(path),
            extra => return Err(format!("unexpected argument {extra}\n{USAGE}").into()),
        }
    }
    let file = file.ok_or_else(|| format!("inspect needs a FILE\n{USAGE}"))?;
    let map = FileDataMap::open(file)?;
    if json {
        println!("{}", xnnblob::inspect::to_json(&map, sha));
    } else {
        print!("{}", xnnblob::inspect::to_text(&map, sha));
    }
    Ok(())
}

fn cache_command(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use xnnblob::cache::{compact_file, verify_file, CacheOptions};
    let [verb, path] = args else {
        return Err(format!("cache needs a command and a PATH\n{USAGE}").into());
    };
    let path = std::path::Path::new(path);
    let options = CacheOptions::default();
    let report = match verb.as_str() {
        "stats" => verify_file(path, &options, false, false)?,
        "verify" => verify_file(path, &options, true, true)?,
        "compact" => compact_file(path, &options)?,
        other => return Err(format!("unknown cache command {other}\n{USAGE}").into()),
    };
    let report = report.map_err(|e| format!("{}: would be rebuilt: {e}", path.display()))?;
    println!(
        "{}: {} entries, {} packed bytes, file {} bytes ({:.3}x packed), {} invalid entries",
        path.display(),
        report.entries,
        report.packed_bytes,
        report.file_size,
        report.file_size as f64 / report.packed_bytes.max(1) as f64,
        report.invalid_entries
    );
    for bad in &report.corrupt {
        println!(
            "corrupt entry: kernel {} bias {} seed {:#010x} at offset {} ({} bytes)",
            bad.key.kernel, bad.key.bias, bad.key.seed, bad.offset, bad.size
        );
    }
    if report.rewritten {
        println!(
            "rewrote {} without bad entries; the next launch repacks them",
            path.display()
        );
    }
    if verb == "verify" && !report.corrupt.is_empty() {
        return Err(format!("{} corrupt entries", report.corrupt.len()).into());
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let widths = [1024, 2048, 2048, 256];
    let batch = 1;
    let mlp = Mlp::random(&widths, 2026);
    let weight_bytes: usize = mlp
        .layers
        .iter()
        .map(|l| (l.weights.len() + l.bias.len()) * 4)
        .sum();
    println!(
        "xnnblob {} demo: 3-layer MLP {widths:?}, {:.1} MiB of fp32 weights",
        env!("CARGO_PKG_VERSION"),
        weight_bytes as f64 / (1 << 20) as f64
    );
    xnn::initialize()?;
    let input: Vec<f32> = (0..widths[0])
        .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
        .collect();
    let graph = mlp.subgraph(batch)?;

    let t = Instant::now();
    let mut plain = Runtime::new(&graph, None)?;
    let create_plain = ms(t);
    let mut output = vec![0f32; widths[3] * batch];
    let t = Instant::now();
    plain.invoke(&[(MLP_INPUT, &input)], &mut [(MLP_OUTPUT, &mut output)])?;
    let first_run = ms(t);

    let cache = WeightsCache::new(InMemoryWeightsCache::new());
    let t = Instant::now();
    drop(Runtime::new(&graph, Some(&cache))?);
    let create_packing = ms(t);
    cache.finalize();
    let t = Instant::now();
    let mut cached = Runtime::new(&graph, Some(&cache))?;
    let create_hit = ms(t);
    let mut cached_output = vec![0f32; output.len()];
    cached.invoke(
        &[(MLP_INPUT, &input)],
        &mut [(MLP_OUTPUT, &mut cached_output)],
    )?;

    let reference = mlp.reference_forward(&input, batch);
    let max_diff = output
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("output[0..8]: {:?}", &output[..8]);
    println!("max |xnnpack - rust reference|: {max_diff:.2e}");
    println!("runtime creation, packing weights (no cache):   {create_plain:8.2} ms");
    println!("runtime creation, packing into in-memory cache: {create_packing:8.2} ms");
    println!("runtime creation, every weight found in cache:  {create_hit:8.2} ms");
    println!("first inference:                                {first_run:8.2} ms");
    let stats = cache.stats();
    println!(
        "cache: {} packed weights, {:.1} MiB, {} look-up hits",
        stats.entries,
        stats.packed_bytes as f64 / (1 << 20) as f64,
        stats.look_up_hits
    );
    if cached_output != output {
        return Err("outputs with and without the cache differ".into());
    }
    if max_diff > 1e-3 {
        return Err(format!("XNNPACK and the Rust reference differ by {max_diff}").into());
    }
    println!("outputs with and without the cache are identical");
    Ok(())
}
