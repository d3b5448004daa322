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
                   (--input FILE [--dtype DTYPE] [--shape DxD...])... [--output-dir DIR]

commands:
  demo     generate a 256 MiB llm-like model (1184 weights) in a temp dir, launch it cold then
           warm in fresh processes, print the warm speed-up and both peak RSS (the default)
  bench    the load benchmark: no cache, XNNPACK's cache, xnnblob cold/warm, the floor
  inspect  list the keys, segments (size, alignment) and tensor layouts of a .ptd or .pte;
           --json prints one JSON object, --sha256 adds each blob's sha256
  run      run a method of an ExecuTorch program fully delegated to XNNPACK: inputs are raw
           little-endian files, of the dtype and shape given after each --input or else the
           method's (a dynamic leading dimension is taken from the file's size); prints
           load/execute timings and each output's dtype, shape and summary; --output-dir writes
           output0.f32, output1.f16, ... (the extension is the dtype)
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
        println!("{}", xnnblob::inspect::to_json(&map, sha)?);
    } else {
        print!("{}", xnnblob::inspect::to_text(&map, sha));
    }
    Ok(())
}

/// One `--input` of `xnnblob run`: a raw file, with the dtype and shape given after it (or
/// taken from the method).
struct InputArg {
    path: String,
    dtype: Option<xnnblob::tensor::DType>,
    shape: Option<Vec<usize>>,
}

fn parse_shape(text: &str) -> Result<Vec<usize>, String> {
    text.split(['x', ','])
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad shape {text:?}: use dimensions like 2x12"))
        })
        .collect()
}

fn run_command(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Instant;
    use xnnblob::backend::{Backend, PackedCache};
    use xnnblob::tensor::{DType, Shape, TensorRef};
    let (mut program, mut data, mut inputs) = (None, Vec::new(), Vec::<InputArg>::new());
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
            "--input" => inputs.push(InputArg {
                path: value("--input")?,
                dtype: None,
                shape: None,
            }),
            "--dtype" => {
                let text = value("--dtype")?;
                let dtype = DType::parse(&text).ok_or_else(|| {
                    format!(
                        "unknown dtype {text:?}: float32, float16, bfloat16, int8, uint8, int32"
                    )
                })?;
                inputs
                    .last_mut()
                    .ok_or("--dtype follows the --input it describes")?
                    .dtype = Some(dtype);
            }
            "--shape" => {
                let shape = parse_shape(&value("--shape")?)?;
                inputs
                    .last_mut()
                    .ok_or("--shape follows the --input it describes")?
                    .shape = Some(shape);
            }
            flag if flag.starts_with("--") => {
                return Err(format!("unknown option {flag}\n{USAGE}").into())
            }
            path if program.is_none() => program = Some(path.to_string()),
            extra => inputs.push(InputArg {
                path: extra.to_string(),
                dtype: None,
                shape: None,
            }),
        }
    }
    let program_path = program.ok_or_else(|| format!("run needs a PROGRAM.pte\n{USAGE}"))?;
    let t = Instant::now();
    let backend = Backend::with_defaults()?;
    let cache = cache.map(|p| PackedCache::File(p.into()));
    let program = xnnblob::program::Program::load(&backend, &program_path, &data, cache.as_ref())?;
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
    let specs = m.input_specs();
    if inputs.len() != specs.len() {
        let declared: Vec<String> = specs
            .iter()
            .map(|s| format!("{} {}", s.dtype, s.bound))
            .collect();
        return Err(format!(
            "method {method_name:?} takes {} inputs ({}); {} given",
            specs.len(),
            declared.join(", "),
            inputs.len()
        )
        .into());
    }
    let mut files = Vec::new();
    for arg in &inputs {
        files.push(std::fs::read(&arg.path).map_err(|e| format!("{}: {e}", arg.path))?);
    }
    let mut views = Vec::new();
    for (i, ((arg, bytes), spec)) in inputs.iter().zip(&files).zip(&specs).enumerate() {
        let dtype = arg.dtype.unwrap_or(spec.dtype);
        let shape = match &arg.shape {
            Some(dims) => Shape::new(dims)?,
            None => {
                let elements = bytes.len() / dtype.size();
                xnnblob::program::rows_for(spec, elements)
            }
        };
        let needed = shape.nbytes(dtype).ok_or("the input's size overflows")?;
        if bytes.len() != needed {
            return Err(format!(
                "{}: {} bytes, an input {i} of {dtype} {shape} needs {needed} (give --dtype and --shape after --input)",
                arg.path,
                bytes.len()
            )
            .into());
        }
        views.push(TensorRef::new(dtype, shape, bytes));
    }
    let t = Instant::now();
    m.execute(&views)?;
    let exec_ms = t.elapsed().as_secs_f64() * 1e3;
    // Outputs are written before anything is printed: a closed stdout loses nothing.
    if let Some(dir) = &out_dir {
        std::fs::create_dir_all(dir)?;
        for i in 0..m.num_outputs() {
            let out = m.output(i)?;
            let name = format!("output{i}.{}", out.dtype().short_name());
            std::fs::write(std::path::Path::new(dir).join(name), out.data())?;
        }
    }
    let (packed, hits) = program
        .weights_cache()
        .map_or((0, 0), |c| (c.stats().packed, c.stats().hits));
    println!(
        "{program_path} method {method_name:?}: loaded in {load_ms:.2} ms ({packed} weights packed, {hits} found packed), executed in {exec_ms:.2} ms"
    );
    for i in 0..m.num_outputs() {
        let out = m.output(i)?;
        let values = xnnblob::tensor::to_f32_lossy(out.dtype(), out.data());
        let (min, max) = values
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        let mean = values.iter().map(|v| *v as f64).sum::<f64>() / values.len().max(1) as f64;
        let head: Vec<String> = values.iter().take(6).map(|v| format!("{v:.5}")).collect();
        println!(
            "output {i}: {} {}, {} values, min {min:.5}, max {max:.5}, mean {mean:.5}, first [{}]",
            out.dtype(),
            out.shape(),
            values.len(),
            head.join(", ")
        );
    }
    if let Some(Err(e)) = program.weights_cache().map(|c| c.wait_saved()) {
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
