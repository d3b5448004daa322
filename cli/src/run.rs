//! `xnnblob run`: a program's methods through xnnblob's own executor, its inputs as files, its
//! outputs summarised or written.

use clap::ArgMatches;
use std::path::PathBuf;
use xnnblob::report::report;

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The program.
    program: PathBuf,
    /// Input files given without --input, in order.
    inputs: Vec<String>,
    /// A .ptd with the program's external data (repeatable).
    #[arg(long)]
    data: Vec<PathBuf>,
    /// The method to run [default: the program's first].
    #[arg(long)]
    method: Option<String>,
    /// Run methods of the one loaded program in this order (repeatable): METHOD:FILE,... with
    /// each input of the dtype and shape the method declares; `{step}` in a path becomes the
    /// iteration (from 0) of the --times that follows. The methods share the program's mutable
    /// buffers: what `prefill` writes, `step` reads. Outputs go to stepK.outputI.EXT.
    #[arg(long, conflicts_with_all = ["method", "input", "inputs"])]
    call: Vec<String>,
    /// Run the --call before it this many times in a row.
    #[arg(long)]
    times: Vec<usize>,
    /// A packed-weight cache file: the first launch packs and saves, later ones pack nothing.
    #[arg(long)]
    cache: Option<PathBuf>,
    /// A read-only packed-weight cache made ahead of time (`xnnblob prepack`), or a directory
    /// of them (repeatable): consulted before --cache, in order, and never written; only what
    /// none holds for this CPU's class is packed, into --cache.
    #[arg(long, requires = "cache")]
    cache_layer: Vec<PathBuf>,
    /// Write output0.f32, output1.f16, ... (the extension is the dtype) into this directory.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// An input file (repeatable; --dtype and --shape after it describe it).
    #[arg(long)]
    input: Vec<String>,
    /// The dtype of the input named before it: float32, float16, bfloat16, int8, uint8, int32.
    #[arg(long)]
    dtype: Vec<String>,
    /// The shape of the input named before it, like 2x12.
    #[arg(long)]
    shape: Vec<String>,
    /// Threads XNNPACK runs on, and a cold launch packs on [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Fail when the --cache path cannot hold a cache file, instead of warning and running
    /// without persistence.
    #[arg(long, requires = "cache")]
    require_cache: bool,
    /// Take the data files' sha256 keys as their bytes' identity without checking them once per
    /// file (for files whose integrity is checked otherwise, e.g. signed).
    #[arg(long)]
    trust_keys: bool,
}

/// `xnnblob run ARGS`, `run` the command's own matches (what tells `--times` which `--call` it
/// follows).
pub(crate) fn run(args: &RunArgs, run: &ArgMatches) -> Result<(), Box<dyn std::error::Error>> {
    calls_of(args, run).and_then(|calls| run_command(args, calls))
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

/// The inputs in command-line order, each with the `--dtype` and `--shape` that follow it: clap
/// keeps each option's values apart, so their positions pair them.
fn input_args(
    args: &RunArgs,
    run: &ArgMatches,
) -> Result<Vec<InputArg>, Box<dyn std::error::Error>> {
    use xnnblob::tensor::DType;
    let positions =
        |id: &str| -> Vec<usize> { run.indices_of(id).map_or(Vec::new(), Iterator::collect) };
    let mut inputs: Vec<(usize, InputArg)> = positions("input")
        .into_iter()
        .zip(&args.input)
        .chain(positions("inputs").into_iter().zip(&args.inputs))
        .map(|(at, path)| {
            (
                at,
                InputArg {
                    path: path.clone(),
                    dtype: None,
                    shape: None,
                },
            )
        })
        .collect();
    inputs.sort_by_key(|(at, _)| *at);
    for (at, text) in positions("dtype").into_iter().zip(&args.dtype) {
        let dtype = DType::parse(text).ok_or_else(|| {
            format!("unknown dtype {text:?}: float32, float16, bfloat16, int8, uint8, int32")
        })?;
        described(&mut inputs, at, "--dtype")?.dtype = Some(dtype);
    }
    for (at, text) in positions("shape").into_iter().zip(&args.shape) {
        let shape = parse_shape(text)?;
        described(&mut inputs, at, "--shape")?.shape = Some(shape);
    }
    Ok(inputs.into_iter().map(|(_, input)| input).collect())
}

/// The input named last before command-line position `at`.
fn described<'a>(
    inputs: &'a mut [(usize, InputArg)],
    at: usize,
    flag: &str,
) -> Result<&'a mut InputArg, String> {
    inputs
        .iter_mut()
        .rev()
        .find(|(input_at, _)| *input_at < at)
        .map(|(_, input)| input)
        .ok_or_else(|| format!("{flag} follows the --input it describes"))
}

/// One `--call`: a method, its inputs, and how many times in a row it runs.
struct CallArg {
    method: String,
    inputs: Vec<InputArg>,
    times: usize,
}

/// What `xnnblob run` executes.
enum Calls {
    /// `--method` (or the first) once, with `--input` files.
    One {
        method: Option<String>,
        inputs: Vec<InputArg>,
    },
    /// `--call`s, in order, on one loaded program.
    Sequence(Vec<CallArg>),
}

impl Calls {
    /// Whether method `name` is run.
    fn runs(&self, name: &str) -> bool {
        match self {
            Calls::One { method, .. } => method.as_deref().is_none_or(|m| m == name),
            Calls::Sequence(calls) => calls.iter().any(|c| c.method == name),
        }
    }
}

/// The calls of `xnnblob run`: each `--call METHOD[:FILE,...]` with the `--times` after it, or
/// the one method and its inputs.
fn calls_of(args: &RunArgs, run: &ArgMatches) -> Result<Calls, Box<dyn std::error::Error>> {
    if args.call.is_empty() {
        if !args.times.is_empty() {
            return Err("--times follows the --call it repeats".into());
        }
        return Ok(Calls::One {
            method: args.method.clone(),
            inputs: input_args(args, run)?,
        });
    }
    let positions =
        |id: &str| -> Vec<usize> { run.indices_of(id).map_or(Vec::new(), Iterator::collect) };
    let mut calls: Vec<(usize, CallArg)> = Vec::new();
    for (at, spec) in positions("call").into_iter().zip(&args.call) {
        let (method, files) = spec.split_once(':').unwrap_or((spec, ""));
        if method.is_empty() {
            return Err(format!("--call {spec}: no method named").into());
        }
        let inputs = files
            .split(',')
            .filter(|f| !f.is_empty())
            .map(|f| InputArg {
                path: f.to_string(),
                dtype: None,
                shape: None,
            })
            .collect();
        calls.push((
            at,
            CallArg {
                method: method.to_string(),
                inputs,
                times: 1,
            },
        ));
    }
    for (at, &times) in positions("times").into_iter().zip(&args.times) {
        let call = calls
            .iter_mut()
            .rev()
            .find(|(call_at, _)| *call_at < at)
            .ok_or("--times follows the --call it repeats")?;
        call.1.times = times;
    }
    Ok(Calls::Sequence(calls.into_iter().map(|(_, c)| c).collect()))
}

/// The inputs of one execute of `method`: each file as the dtype and shape given, or as the
/// method declares (for a dynamic leading dimension, as many rows as the file holds).
fn input_views<'a>(
    method: &xnnblob::program::Method,
    inputs: &[InputArg],
    files: &'a [(String, Vec<u8>)],
) -> Result<Vec<xnnblob::tensor::TensorRef<'a>>, Box<dyn std::error::Error>> {
    use xnnblob::tensor::{Shape, TensorRef};
    let specs = method.input_specs();
    if inputs.len() != specs.len() {
        let declared: Vec<String> = specs
            .iter()
            .map(|s| format!("{} {}", s.dtype, s.bound))
            .collect();
        return Err(format!(
            "method {:?} takes {} inputs ({}); {} given",
            method.name(),
            specs.len(),
            declared.join(", "),
            inputs.len()
        )
        .into());
    }
    let mut views = Vec::new();
    for (i, ((arg, (path, bytes)), spec)) in inputs.iter().zip(files).zip(&specs).enumerate() {
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
                "{path}: {} bytes, an input {i} of {dtype} {shape} needs {needed} (give --dtype and --shape after --input)",
                bytes.len()
            )
            .into());
        }
        views.push(TensorRef::new(dtype, shape, bytes));
    }
    Ok(views)
}

/// One line on output `i`: dtype, shape, range, mean and first values.
fn output_summary(i: usize, out: xnnblob::tensor::TensorRef<'_>) -> String {
    let values = xnnblob::tensor::to_f32_lossy(out.dtype(), out.data());
    let (min, max) = values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    let mean = values.iter().map(|v| *v as f64).sum::<f64>() / values.len().max(1) as f64;
    let head: Vec<String> = values.iter().take(6).map(|v| format!("{v:.5}")).collect();
    format!(
        "output {i}: {} {}, {} values, min {min:.5}, max {max:.5}, mean {mean:.5}, first [{}]",
        out.dtype(),
        out.shape(),
        values.len(),
        head.join(", ")
    )
}

fn run_command(args: &RunArgs, calls: Calls) -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Instant;
    use xnnblob::backend::{Backend, CacheNotice, WeightsCacheChoice};
    let program_path = args.program.display().to_string();
    let (data, cache, out_dir) = (&args.data, args.cache.clone(), &args.output_dir);
    let t = Instant::now();
    let backend = Backend::new(xnnblob::backend::BackendOptions {
        threads: args
            .threads
            .unwrap_or_else(xnnblob::backend::machine_threads),
        // A command run once can afford the check of what it used, after its load.
        cache_options: xnnblob::cache::CacheOptions {
            verify: xnnblob::cache::VerifyPacked::Background,
            key_trust: if args.trust_keys {
                xnnblob::cache::KeyTrust::TrustKeys
            } else {
                xnnblob::cache::KeyTrust::CheckEachFile
            },
            ..Default::default()
        },
        ..Default::default()
    })?;
    // The backend's one resolver; this face says its notice on stderr, and with
    // `--require-cache` an unusable path is the command's error.
    let cache = match cache {
        None => None,
        Some(path) => {
            let request = if args.cache_layer.is_empty() {
                WeightsCacheChoice::File(path)
            } else {
                WeightsCacheChoice::Layered {
                    layers: args.cache_layer.clone(),
                    path,
                }
            };
            match backend.resolve_weights(&request, false).1 {
                Some(CacheNotice::Unusable { error, .. }) if args.require_cache => {
                    return Err(error.into());
                }
                Some(notice @ CacheNotice::Unusable { .. }) => {
                    eprintln!("xnnblob: warning: {notice}");
                    Some(WeightsCacheChoice::InMemory)
                }
                Some(notice) => {
                    eprintln!("xnnblob: {notice}");
                    Some(request)
                }
                None => Some(request),
            }
        }
    };
    let program = xnnblob::program::Program::load(&backend, &args.program, data, cache.as_ref())?;
    // A shared buffer frozen into a called method's delegate at export gives wrong outputs
    // without any error: said before the methods are made (one may still be refused).
    for s in program.frozen_buffer_suspects() {
        if calls.runs(&s.method) {
            eprintln!("xnnblob: warning: {s}");
        }
    }
    // Known only once the program's files have limited the cache (its load does that).
    if let Some(note) = program.weights_cache().and_then(|c| c.permissions_note()) {
        eprintln!("xnnblob: warning: {note}");
    }
    let calls = match calls {
        Calls::One { method, inputs } => {
            let method = match method {
                Some(m) => m,
                None => program
                    .method_names()
                    .first()
                    .map(|s| s.to_string())
                    .ok_or("the program has no methods")?,
            };
            vec![CallArg {
                method,
                inputs,
                times: 1,
            }]
        }
        Calls::Sequence(calls) => calls,
    };
    // One instance of each method called, all sharing the program's mutable buffers.
    let mut methods: Vec<xnnblob::program::Method> = Vec::new();
    for call in &calls {
        if !methods.iter().any(|m| m.name() == call.method) {
            methods.push(program.method(&call.method)?);
        }
    }
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let sequence = calls.len() > 1 || calls[0].times > 1;
    // (method, iteration, ms, each output's summary) of each execute, printed at the end.
    let mut made: Vec<(String, usize, f64, Vec<String>)> = Vec::new();
    for call in &calls {
        let m = methods
            .iter_mut()
            .find(|m| m.name() == call.method)
            .expect("made above");
        for iteration in 0..call.times {
            let files: Vec<(String, Vec<u8>)> = call
                .inputs
                .iter()
                .map(|arg| {
                    let path = arg.path.replace("{step}", &iteration.to_string());
                    let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
                    Ok::<_, String>((path, bytes))
                })
                .collect::<Result<_, _>>()?;
            let views = input_views(m, &call.inputs, &files)?;
            let t = Instant::now();
            m.execute(&views)?;
            let exec_ms = t.elapsed().as_secs_f64() * 1e3;
            // Outputs are written before anything is printed: a closed stdout loses nothing.
            let prefix = if sequence {
                format!("step{}.", made.len())
            } else {
                String::new()
            };
            if let Some(dir) = out_dir {
                std::fs::create_dir_all(dir)?;
                for i in 0..m.num_outputs() {
                    let out = m.output(i)?;
                    let name = format!("{prefix}output{i}.{}", out.dtype().short_name());
                    std::fs::write(std::path::Path::new(dir).join(name), out.data())?;
                }
            }
            let summaries = (0..m.num_outputs())
                .map(|i| Ok(output_summary(i, m.output(i)?)))
                .collect::<Result<_, xnnblob::program::ProgramError>>()?;
            made.push((call.method.clone(), iteration, exec_ms, summaries));
        }
    }
    // Printed in a closure so that a reader that went away still lets the save finish below.
    let print = || -> Result<(), Box<dyn std::error::Error>> {
        let (packed, hits) = program
            .weights_cache()
            .map_or((0, 0), |c| (c.stats().packed, c.stats().hits));
        let loaded =
            format!("loaded in {load_ms:.2} ms ({packed} weights packed, {hits} found packed)");
        if sequence {
            outln!("{program_path}: {loaded}; {} calls", made.len());
        }
        for (k, (method, iteration, exec_ms, summaries)) in made.iter().enumerate() {
            if sequence {
                outln!(
                    "call {k}: method {method:?} iteration {iteration}: executed in {exec_ms:.2} ms"
                );
            } else {
                outln!("{program_path} method {method:?}: {loaded}, executed in {exec_ms:.2} ms");
            }
            for line in summaries {
                outln!("{line}");
            }
        }
        Ok(())
    };
    let printed = print();
    if let Some(cache) = program.weights_cache() {
        if let Err(e) = cache.wait_saved() {
            eprintln!(
                "xnnblob: the packed-weight cache was not saved: {}",
                report(&e)
            );
        }
        let stats = cache.stats();
        if stats.key_mismatches > 0 {
            eprintln!(
                "xnnblob: warning: {} named keys of the data do not match their bytes (the file \
                 was changed after export?): their bytes' own hash was used, so they were packed \
                 from what the file holds; `xnnblob inspect --verify-keys` lists them",
                stats.key_mismatches
            );
        }
        if let Some(note) = cache.damage_note() {
            eprintln!("xnnblob: warning: {note}");
        }
    }
    printed
}
