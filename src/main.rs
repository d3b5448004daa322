//! The `xnnblob` command line.

use std::process::ExitCode;
use xnnblob::named_data::FileDataMap;

const USAGE: &str = "\
usage: xnnblob [demo [--mib N]]
       xnnblob bench [OPTIONS]   (xnnblob bench --help)
       xnnblob inspect FILE [--json] [--sha256]
       xnnblob cache stats|verify|compact PATH
       xnnblob link FILE.ptd --out DIR
       xnnblob run PROGRAM.pte [--data FILE.ptd]... [--method NAME] [--cache PATH]
                   --input FILE.f32... [--output-dir DIR]

commands:
  demo     generate a 256 MiB llm-like model (1184 weights) in a temp dir, launch it cold then
           warm in fresh processes, print the warm speed-up and both peak RSS (the default)
  bench    the load benchmark: no cache, XNNPACK's cache, xnnblob cold/warm, the floor
  inspect  list the keys, segments (size, alignment) and tensor layouts of a .ptd or .pte;
           --json prints one JSON object, --sha256 adds each blob's sha256
  run      run a method of an ExecuTorch program fully delegated to XNNPACK: inputs are raw
           little-endian f32 files (shapes from the method), prints load/execute timings and a
           summary of each output; --output-dir writes output0.f32, output1.f32, ...
  link     generate Rust source that links a .ptd's parameters into a binary (one static per
           parameter in section .xnnblob_params, looked up by id): DIR/linked_params.rs + .bin files
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
        Some("run") => run_command(&args[1..]),
        Some("link") => match &args[1..] {
            [ptd, flag, out] if flag == "--out" => {
                xnnblob::link::generate(std::path::Path::new(ptd), std::path::Path::new(out))
                    .map(|p| println!("written {}", p.display()))
                    .map_err(|e| format!("{ptd}: {e}").into())
            }
            _ => Err(format!("usage: xnnblob link FILE.ptd --out DIR\n{USAGE}").into()),
        },
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

fn run_command(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Instant;
    let (mut program, mut data, mut inputs) = (None, Vec::new(), Vec::new());
    let (mut method, mut cache, mut out_dir) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--data" => data.push(value("--data")?),
            "--method" => method = Some(value("--method")?),
            "--cache" => cache = Some(value("--cache")?),
            "--output-dir" => out_dir = Some(value("--output-dir")?),
            "--input" => inputs.push(value("--input")?),
            flag if flag.starts_with("--") => {
                return Err(format!("unknown option {flag}\n{USAGE}").into())
            }
            path if program.is_none() => program = Some(path.to_string()),
            extra => inputs.push(extra.to_string()),
        }
    }
    let program_path = program.ok_or_else(|| format!("run needs a PROGRAM.pte\n{USAGE}"))?;
    let t = Instant::now();
    let program = xnnblob::program::Program::load(
        &program_path,
        &data,
        cache.as_deref().map(std::path::Path::new),
    )?;
    let method_name = match method {
        Some(m) => m,
        None => program
            .method_names()
            .first()
            .map(|s| s.to_string())
            .ok_or("the program has no methods")?,
    };
    let mut m = program.method(&method_name)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let shapes = m.input_shapes();
    if inputs.len() != shapes.len() {
        return Err(format!(
            "method {method_name:?} takes {} inputs (shapes {shapes:?}); {} given",
            shapes.len(),
            inputs.len()
        )
        .into());
    }
    let mut tensors = Vec::new();
    for (path, shape) in inputs.iter().zip(&shapes) {
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let expected: usize = shape.iter().product::<usize>() * 4;
        if bytes.len() != expected {
            return Err(format!(
                "{path}: {} bytes, the input of shape {shape:?} needs {expected}",
                bytes.len()
            )
            .into());
        }
        tensors.push(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<f32>>(),
        );
    }
    let refs: Vec<&[f32]> = tensors.iter().map(Vec::as_slice).collect();
    let t = Instant::now();
    let outputs = m.execute(&refs)?;
    let exec_ms = t.elapsed().as_secs_f64() * 1e3;
    let w = program.weights_cache().stats();
    println!(
        "{program_path} method {method_name:?}: loaded in {load_ms:.2} ms ({} weights packed, {} found packed), executed in {exec_ms:.2} ms",
        w.packed, w.hits
    );
    for (i, out) in outputs.iter().enumerate() {
        let (min, max) = out
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        let mean = out.iter().map(|v| *v as f64).sum::<f64>() / out.len().max(1) as f64;
        let head: Vec<String> = out.iter().take(6).map(|v| format!("{v:.5}")).collect();
        println!(
            "output {i}: {} values, min {min:.5}, max {max:.5}, mean {mean:.5}, first [{}]",
            out.len(),
            head.join(", ")
        );
        if let Some(dir) = &out_dir {
            std::fs::create_dir_all(dir)?;
            let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(
                std::path::Path::new(dir).join(format!("output{i}.f32")),
                bytes,
            )?;
        }
    }
    if let Err(e) = program.weights_cache().wait_saved() {
        eprintln!("xnnblob: the packed-weight cache was not saved: {e}");
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
