//! The `xnnblob` command line.

use std::process::ExitCode;
use xnnblob::named_data::FileDataMap;

const USAGE: &str = "\
usage: xnnblob [demo [--mib N]]
       xnnblob bench [OPTIONS]   (xnnblob bench --help)
       xnnblob inspect FILE [--json] [--sha256]
       xnnblob cache stats|verify|compact PATH

commands:
  demo     generate a 256 MiB llm-like model (1184 weights) in a temp dir, launch it cold then
           warm in fresh processes, print the warm speed-up and both peak RSS (the default)
  bench    the load benchmark: no cache, XNNPACK's cache, xnnblob cold/warm, the floor
  inspect  list the keys, segments (size, alignment) and tensor layouts of a .ptd or .pte;
           --json prints one JSON object, --sha256 adds each blob's sha256
  cache    a packed-weight cache file: stats (header and index only), verify (checksums every
           packed weight and drops bad entries so the next launch repacks them; exit 1 if any),
           compact (rewrites only the valid entries, tightly)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None | Some("demo") => xnnblob::bench::demo(&args[args.len().min(1)..]).map_err(Into::into),
        Some("bench") if args.iter().any(|a| a == "--help" || a == "-h") => {
            println!("{}", xnnblob::bench::USAGE);
            Ok(())
        }
        Some("bench") => xnnblob::bench::main(&args[1..], true).map_err(Into::into),
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
