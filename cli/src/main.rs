//! The `xnnblob` command line.

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use xnnblob::named_data::FileDataMap;

mod inspect;
mod prepack;
use xnnblob::report::report;

/// Writes to stdout, returning the error instead of panicking: a reader that goes away (`| head`,
/// `| true`) ends the output, and [`main`] treats the broken pipe as a normal end.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*)?
    }};
}

/// [`out!`] with a newline.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)?
    }};
}

/// Fast, lean model loading for XNNPACK: run ExecuTorch programs with a persistent packed-weight
/// cache, inspect their named data, link weights into binaries, measure load times.
#[derive(Parser)]
#[command(name = "xnnblob", version, about)]
struct Cli {
    /// What to do [default: demo].
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a 256 MiB llm-like model (1184 weights) in a temp dir, launch it cold then warm
    /// in fresh processes, print the warm speed-up and both peak RSS.
    Demo {
        /// Weights in MiB.
        #[arg(long, default_value_t = 256)]
        mib: usize,
    },
    /// The load benchmark: no cache, XNNPACK's cache, xnnblob cold and warm, the floor; or
    /// `compare` two bench results.
    Bench(BenchCommand),
    /// List the keys, segments (size, alignment) and tensor layouts of a .ptd or .pte.
    Inspect {
        /// A .ptd or .pte file.
        file: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Add each blob's sha256.
        #[arg(long)]
        sha256: bool,
        /// Check that every key named by content (a sha256, as ExecuTorch's exporter names
        /// blobs) is the sha256 of its bytes (reads every such blob); exits 1 if one is not.
        #[arg(long, conflicts_with_all = ["json", "sha256"])]
        verify_keys: bool,
    },
    /// A packed-weight cache file: its header and index, its checksums, or a compacted copy.
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Generate Rust source that links a .ptd's parameters into a binary (one static per
    /// parameter in section .xnnblob_params, looked up by id): DIR/linked_params.rs + .bin files.
    Link {
        /// The .ptd whose parameters to link.
        ptd: PathBuf,
        /// Where the source and parameter files go.
        #[arg(long)]
        out: PathBuf,
        /// The name exported symbols carry [default: the file's stem].
        #[arg(long)]
        model: Option<String>,
    },
    /// Run a method of an ExecuTorch program fully delegated to XNNPACK. Inputs are raw
    /// little-endian files, of the dtype and shape given after each --input or else the
    /// method's (a dynamic leading dimension is taken from the file's size). Prints load and
    /// execute timings and each output's dtype, shape and summary.
    Run(RunArgs),
    /// Pack a program's weights ahead of time, one read-only cache file per CPU class an app
    /// ships to (DIR/STEM.CLASS.xbc), so that a device's first launch packs nothing: give the
    /// directory to `run --cache-layer`, or to the ExecuTorch backend's `packed_cache_layers`.
    /// Classes this host is not of are packed on an emulated CPU of the class (qemu-x86_64, or
    /// qemu-aarch64 with --aarch64-xnnblob).
    Prepack(PrepackArgs),
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCommand {
    #[command(subcommand)]
    action: Option<BenchAction>,
    #[command(flatten)]
    args: xnnblob_cli::bench::BenchArgs,
}

#[derive(Subcommand)]
enum BenchAction {
    /// The change of every scenario two results share (the peer bench's peer.json); exits 1 if
    /// one got slower by more than --max-regression percent.
    Compare {
        /// The reference results.
        base: PathBuf,
        /// The results to check.
        new: PathBuf,
        /// The largest slowdown of a median allowed, in percent.
        #[arg(long, default_value_t = 10.0)]
        max_regression: f64,
    },
    /// A prompt's prefill in ExecuTorch's runtime, xnnblob's drop-in against ExecuTorch's own
    /// backend: four 8da4w feed-forward blocks over T token rows, timed here and, on each
    /// --aarch64 CPU, counted in instructions under qemu-aarch64 (prefill.md, prefill.json).
    Prefill {
        /// Prompt lengths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,16,128,512")]
        tokens: Vec<u32>,
        /// Fresh launches per backend and length, alternating (0: count only, no timing).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Executes timed per launch, after the first.
        #[arg(long, default_value_t = 10)]
        executes: usize,
        /// qemu CPU models to count instructions on, comma-separated (cortex-a53, neoverse-n1,
        /// max,sme=off written max;sme=off ...) [default: none].
        #[arg(long, value_delimiter = ',')]
        aarch64: Vec<String>,
        /// The qemu-aarch64 to count under [default: the one on PATH]: another build, such as
        /// one that emulates SME2 (scripts/build-qemu.sh); the report names its version.
        #[arg(long)]
        qemu: Option<PathBuf>,
        /// Where the programs and the reports go.
        #[arg(long, default_value = "target/bench/prefill")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum CacheAction {
    /// The header and index only (reads no packed weight): entries, sizes, and the live, stale
    /// and evictable bytes under the default budget (twice the live bytes).
    Stats {
        /// The cache file.
        path: PathBuf,
    },
    /// Checksum every packed weight and drop bad entries, so the next launch repacks them;
    /// exits 1 if any was bad.
    Verify {
        /// The cache file.
        path: PathBuf,
        /// Also load this program's methods warm against the file: every entry they look up
        /// must be the size XNNPACK reads for its weight. One that is not is repacked, the file
        /// is repaired, and the command exits 1.
        #[arg(long)]
        program: Option<PathBuf>,
        /// A .ptd with the program's external data (repeatable).
        #[arg(long, requires = "program")]
        data: Vec<PathBuf>,
    },
    /// A kill -9 campaign: launches of a generated model killed at random moments (packing,
    /// saving, renaming); after each kill a launch must complete with the outputs of a run
    /// without cache and the file must verify; at the end the file must be the size of one built
    /// from scratch with no temporary file left. Prints the counts; exits 1 if a promise broke.
    Torture {
        /// Launches to kill.
        #[arg(long, default_value_t = 1000)]
        kills: usize,
        /// Weights of the generated qd8 model, MiB.
        #[arg(long, default_value_t = 8)]
        mib: usize,
        /// Seeds the kill moments.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where the model, caches and outputs go [default: a new temporary directory].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Rewrite only the valid entries, tightly, without the stale ones beyond twice the live
    /// bytes (what the next save would evict).
    Compact {
        /// The cache file.
        path: PathBuf,
    },
}

#[derive(clap::Args)]
struct PrepackArgs {
    /// The program.
    #[arg(required_unless_present = "list_classes")]
    program: Option<PathBuf>,
    /// A .ptd with the program's external data (repeatable).
    #[arg(long)]
    data: Vec<PathBuf>,
    /// A CPU class to pack for (repeatable; `--list-classes` names them), or `host` for this
    /// CPU's.
    #[arg(long = "cpu", required_unless_present_any = ["list_classes", "as_class"])]
    cpus: Vec<String>,
    /// The directory the cache files are written to (made if missing).
    #[arg(long, required_unless_present = "list_classes")]
    out: Option<PathBuf>,
    /// The name files start with [default: the program's file stem].
    #[arg(long)]
    name: Option<String>,
    /// This command built for aarch64 (`scripts/install.sh --target aarch64`), run under
    /// qemu-aarch64 for the aarch64 classes [default: $XNNBLOB_AARCH64_XNNBLOB].
    #[arg(long)]
    aarch64_xnnblob: Option<PathBuf>,
    /// List the CPU classes, each with the CPUs it stands for and the kernels XNNPACK picks on
    /// it.
    #[arg(long)]
    list_classes: bool,
    /// Set by prepack for the child it starts on an emulated CPU: pack here, as this class,
    /// after checking that this CPU is of it.
    #[arg(long = "as", hide = true)]
    as_class: Option<String>,
}

#[derive(clap::Args)]
struct RunArgs {
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

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command.unwrap_or(Command::Demo { mib: 256 }) {
        Command::Demo { mib } => xnnblob_cli::bench::demo(mib).map_err(Into::into),
        Command::Bench(BenchCommand {
            action:
                Some(BenchAction::Compare {
                    base,
                    new,
                    max_regression,
                }),
            ..
        }) => match xnnblob_cli::bench::compare::compare(&base, &new, max_regression) {
            Ok((report, regressed)) => {
                let printed = (|| -> Result<(), Box<dyn std::error::Error>> {
                    out!("{report}");
                    Ok(())
                })();
                if regressed {
                    return ExitCode::FAILURE;
                }
                printed
            }
            Err(e) => Err(e.into()),
        },
        Command::Bench(BenchCommand {
            action:
                Some(BenchAction::Prefill {
                    tokens,
                    repeats,
                    executes,
                    aarch64,
                    qemu,
                    out,
                }),
            ..
        }) => xnnblob_cli::bench::peer::runner_near_executable()
            .and_then(|runner| {
                xnnblob_cli::bench::prefill::run(&xnnblob_cli::bench::prefill::PrefillOptions {
                    runner,
                    tokens,
                    repeats,
                    executes,
                    // A comma separates CPUs, so a model's features are written with ';'.
                    aarch64: aarch64.iter().map(|c| c.replace(';', ",")).collect(),
                    qemu,
                    out,
                })
            })
            .map_err(Into::into)
            .and_then(|r| -> Result<(), Box<dyn std::error::Error>> {
                out!("{}", xnnblob_cli::bench::prefill::markdown(&r));
                Ok(())
            }),
        Command::Bench(BenchCommand { args, .. }) => {
            xnnblob_cli::bench::main(&args, true).map_err(Into::into)
        }
        Command::Inspect {
            file,
            verify_keys: true,
            ..
        } => inspect_keys(&file),
        Command::Inspect {
            file, json, sha256, ..
        } => inspect(&file, json, sha256),
        Command::Cache { action } => cache_command(action),
        Command::Link { ptd, out, model } => link(&ptd, &out, model.as_deref()),
        Command::Run(args) => {
            let run = matches.subcommand_matches("run").expect("the run command");
            calls_of(&args, run).and_then(|calls| run_command(&args, calls))
        }
        Command::Prepack(args) => prepack_command(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away: everything else (outputs, the cache) is done.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xnnblob: {}", report(&*e));
            ExitCode::FAILURE
        }
    }
}

fn inspect(file: &Path, json: bool, sha: bool) -> Result<(), Box<dyn std::error::Error>> {
    let map = FileDataMap::open(file)?;
    // A program's XNNPACK delegates: their node types and datatypes, and whether this build
    // runs them.
    let delegates = match map.kind() {
        xnnblob::named_data::FileKind::Pte => Some(delegate_summaries(&map)?),
        xnnblob::named_data::FileKind::Ptd => None,
    };
    if json {
        let mut value: serde_json::Value = serde_json::from_str(&inspect::to_json(&map, sha)?)?;
        if let Some(d) = &delegates {
            value["delegates"] = delegates_json(d);
        }
        outln!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        out!("{}", inspect::to_text(&map, sha));
        if let Some(d) = &delegates {
            out!("{}", delegates_text(d));
        }
    }
    // Shared mutable buffers that ExecuTorch's partitioner may have frozen into a delegate: a
    // warning on stderr, so the report itself stays as it was.
    if delegates.is_some() {
        for s in xnnblob::program::frozen_buffer_suspects(&map)? {
            eprintln!("xnnblob: warning: {s}");
        }
    }
    Ok(())
}

/// (method, delegate index, summary) for each XNNPACK delegate of a program.
type Summaries = Vec<(String, usize, xnnblob::delegate::PayloadSummary)>;

fn delegate_summaries(map: &FileDataMap) -> Result<Summaries, Box<dyn std::error::Error>> {
    let mut all = Vec::new();
    for (method, payloads) in xnnblob::program::delegate_payloads(map)? {
        for (i, payload) in payloads.iter().enumerate() {
            let summary = xnnblob::delegate::summarize(payload)
                .map_err(|e| format!("method {method}, delegate {i}: {}", report(&e)))?;
            all.push((method.clone(), i, summary));
        }
    }
    Ok(all)
}

fn delegates_text(summaries: &Summaries) -> String {
    use std::fmt::Write as _;
    let mut text = String::from("xnnpack delegates:\n");
    if summaries.is_empty() {
        text.push_str("  none\n");
    }
    for (method, i, s) in summaries {
        let total: usize = s.nodes.iter().map(|(_, n, _)| n).sum();
        let verdict = if s.supported() {
            "this build runs every node".to_string()
        } else {
            let missing: Vec<&str> = s
                .nodes
                .iter()
                .filter(|(_, _, ok)| !ok)
                .map(|(n, _, _)| n.as_str())
                .collect();
            format!("NOT RUNNABLE by this build: {}", missing.join(", "))
        };
        let _ = writeln!(text, "  {method} #{i}: {total} nodes; {verdict}");
        let nodes: Vec<String> = s
            .nodes
            .iter()
            .map(|(n, c, _)| format!("{n} x{c}"))
            .collect();
        let _ = writeln!(text, "    nodes: {}", nodes.join(", "));
        let types: Vec<String> = s
            .datatypes
            .iter()
            .map(|(t, c)| format!("{t} x{c}"))
            .collect();
        let _ = writeln!(text, "    datatypes: {}", types.join(", "));
    }
    text
}

fn delegates_json(summaries: &Summaries) -> serde_json::Value {
    serde_json::Value::Array(
        summaries
            .iter()
            .map(|(method, i, s)| {
                serde_json::json!({
                    "method": method,
                    "index": i,
                    "supported": s.supported(),
                    "nodes": s.nodes.iter().map(|(n, c, ok)| serde_json::json!({"type": n, "count": c, "supported": ok})).collect::<Vec<_>>(),
                    "datatypes": s.datatypes.iter().map(|(t, c)| serde_json::json!({"datatype": t, "count": c})).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// `xnnblob inspect --verify-keys`.
fn inspect_keys(file: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let map = FileDataMap::open(file)?;
    let (checked, mismatches) = xnnblob::cache::verify_keys(&map)?;
    for m in &mismatches {
        outln!("key {} holds bytes whose sha256 is {}", m.key, m.actual);
    }
    outln!(
        "{}: {checked} keys named by content checked, {} do not match their bytes",
        file.display(),
        mismatches.len()
    );
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: {} keys do not name their bytes: a packed-weight cache would serve the packing \
             of other bytes for them",
            file.display(),
            mismatches.len()
        )
        .into())
    }
}

fn link(ptd: &Path, out: &Path, model: Option<&str>) -> Result<(), Box<dyn std::error::Error>> {
    let written = match model {
        Some(model) => xnnblob_link::generate_named(ptd, out, model),
        None => xnnblob_link::generate(ptd, out),
    };
    let written = written.map_err(|e| format!("{}: {e}", ptd.display()))?;
    outln!("written {}", written.display());
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
    use xnnblob::backend::{Backend, CacheNotice, PackedCache};
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
                PackedCache::File(path)
            } else {
                PackedCache::Layered {
                    layers: args.cache_layer.clone(),
                    path,
                }
            };
            match backend.resolve_weights(&request, false).1 {
                Some(CacheNotice::Unusable { error, .. }) if args.require_cache => {
                    return Err(error.into())
                }
                Some(notice @ CacheNotice::Unusable { .. }) => {
                    eprintln!("xnnblob: warning: {notice}");
                    Some(PackedCache::InMemory)
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
                outln!("call {k}: method {method:?} iteration {iteration}: executed in {exec_ms:.2} ms");
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

/// `xnnblob cache torture`: the campaign in `dir`, or in a temporary directory it removes after.
fn torture_command(
    kills: usize,
    mib: usize,
    seed: u64,
    dir: Option<PathBuf>,
) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = dir
        .is_none()
        .then(|| std::env::temp_dir().join(format!("xnnblob-torture-{}", std::process::id())));
    let run_dir = dir.or(scratch.clone()).unwrap_or_default();
    let report = xnnblob_cli::torture::torture(&xnnblob_cli::torture::TortureOptions {
        kills,
        mib,
        seed,
        dir: run_dir,
        exe: std::env::current_exe()?,
    });
    if let Some(s) = scratch {
        let _ = std::fs::remove_dir_all(s);
    }
    let report = report?;
    outln!("{report}");
    if report.passed() {
        Ok(())
    } else {
        Err("the torture campaign broke a promise (counts above)".into())
    }
}

fn cache_command(action: CacheAction) -> Result<(), Box<dyn std::error::Error>> {
    use xnnblob::cache::{compact_file, verify_file, CacheOptions};
    let options = CacheOptions::default();
    let (report, path, verify) = match &action {
        CacheAction::Stats { path } => (verify_file(path, &options, false, false)?, path, false),
        CacheAction::Verify { path, .. } => (verify_file(path, &options, true, true)?, path, true),
        CacheAction::Compact { path } => (compact_file(path, &options)?, path, false),
        CacheAction::Torture {
            kills,
            mib,
            seed,
            dir,
        } => return torture_command(*kills, *mib, *seed, dir.clone()),
    };
    let report = report.map_err(|e| {
        format!(
            "{}: would be rebuilt: {}",
            path.display(),
            xnnblob::report::Report(&e)
        )
    })?;
    outln!(
        "{}: {} entries, {} packed bytes, file {} bytes ({:.3}x packed), {} invalid entries",
        path.display(),
        report.entries,
        report.packed_bytes,
        report.file_size,
        report.file_size as f64 / report.packed_bytes.max(1) as f64,
        report.invalid_entries
    );
    outln!(
        "live {} bytes (used by the last save, number {}), stale {} bytes, evictable {} bytes \
         (beyond twice the live bytes)",
        report.live_bytes,
        report.last_save,
        report.stale_bytes,
        report.evictable_bytes
    );
    if report.evicted > 0 {
        outln!(
            "evicted {} stale entries beyond twice the live bytes",
            report.evicted
        );
    }
    for bad in &report.corrupt {
        outln!(
            "corrupt entry: kernel {} bias {} seed {:#010x} at offset {} ({} bytes)",
            bad.key.kernel,
            bad.key.bias,
            bad.key.seed,
            bad.offset,
            bad.size
        );
    }
    if report.rewritten {
        outln!(
            "rewrote {} without bad entries; the next launch repacks them",
            path.display()
        );
    }
    if verify && !report.corrupt.is_empty() {
        return Err(format!("{} corrupt entries", report.corrupt.len()).into());
    }
    if let CacheAction::Verify {
        path,
        program: Some(program),
        data,
    } = &action
    {
        verify_against_program(path, program, data)?;
    }
    Ok(())
}

/// `xnnblob cache verify PATH --program X.pte`: loads every method of the program against the
/// file, so that XNNPACK looks each of its weights up with the size it reads; reports the
/// entries of another size (forgotten, repacked, and replaced in the file by the save).
fn verify_against_program(
    path: &std::path::Path,
    program: &std::path::Path,
    data: &[PathBuf],
) -> Result<(), Box<dyn std::error::Error>> {
    use xnnblob::backend::{Backend, BackendOptions, PackedCache};
    use xnnblob::program::{Program, ProgramError};
    let backend = Backend::new(BackendOptions::default())?;
    let loaded = Program::load(
        &backend,
        program,
        data,
        Some(&PackedCache::File(path.to_path_buf())),
    )?;
    let mut not_delegated = Vec::new();
    for name in loaded.method_names() {
        match loaded.method(name) {
            Ok(_) => {}
            Err(ProgramError::NotDelegated { operator, .. }) => {
                not_delegated.push(format!("{name} ({operator})"))
            }
            Err(e) => return Err(format!("{name}: {e}").into()),
        }
    }
    let cache = backend.file_cache(path)?;
    cache.wait_saved()?;
    let stats = cache.stats();
    outln!(
        "{}: {} look-ups found their entry, {} missed (packed now), {} entries of another size \
         than XNNPACK reads",
        program.display(),
        stats.hits,
        stats.misses,
        stats.wrong_size
    );
    if !not_delegated.is_empty() {
        outln!(
            "not checked (not fully delegated to XNNPACK): {}",
            not_delegated.join(", ")
        );
    }
    if stats.wrong_size > 0 {
        outln!(
            "repacked them and rewrote {}; the next launch finds the right sizes",
            path.display()
        );
        return Err(format!("{} entries of the wrong size", stats.wrong_size).into());
    }
    Ok(())
}

/// `xnnblob prepack`: one read-only cache file per class asked for (see `prepack.rs`).
/// The `xnnblob` that packs for class `c` under qemu: this one for x86-64 classes on an x86-64
/// host, the one `--aarch64-xnnblob` (or `XNNBLOB_AARCH64_XNNBLOB`) names for aarch64 ones.
fn emulation_tool(
    c: &prepack::Class,
    args: &PrepackArgs,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    Ok(match c.arch {
        prepack::Arch::X86_64 if cfg!(target_arch = "x86_64") => std::env::current_exe()?,
        prepack::Arch::Aarch64 => args
            .aarch64_xnnblob
            .clone()
            .or_else(|| std::env::var_os("XNNBLOB_AARCH64_XNNBLOB").map(PathBuf::from))
            .ok_or_else(|| {
                format!(
                    "class {}: give --aarch64-xnnblob (this command built for aarch64)",
                    c.name
                )
            })?,
        prepack::Arch::X86_64 => {
            return Err(format!("class {}: run prepack on an x86-64 host", c.name).into())
        }
    })
}

fn prepack_command(args: &PrepackArgs) -> Result<(), Box<dyn std::error::Error>> {
    use prepack::{check_here, class, emulated_command, file_for, CLASSES};
    let pack_here = |program: &Path, data: &[PathBuf], file: &Path| {
        xnnblob::program::pack_ahead(program, data, file).map(|p| (p.entries, p.bytes))
    };
    if args.list_classes {
        for c in CLASSES {
            let how = match c.qemu_cpu {
                Some(cpu) => {
                    format!("packed here if this CPU is of it, else under qemu -cpu {cpu}")
                }
                None => "packed only on a CPU of the class".to_string(),
            };
            outln!(
                "{}\n  CPUs: {}\n  kernels: xnn_qd8_f32_*_gemm_*{}*\n  {how}",
                c.name,
                c.cpus,
                c.kernel_family
            );
        }
        let here = prepack::kernels_here().unwrap_or_default();
        outln!("this CPU: {}", here.join(", "));
        return Ok(());
    }
    let (Some(program), Some(out)) = (&args.program, &args.out) else {
        return Err("prepack needs a program, --cpu and --out".into());
    };
    let stem = match &args.name {
        Some(name) => name.clone(),
        None => program
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .ok_or("the program path has no file name")?,
    };
    // Every class named, and the tool each emulated one needs, before anything is written.
    for name in args.cpus.iter().filter(|n| *n != "host") {
        let c = class(name)?;
        if let Err(why) = check_here(c) {
            emulated_command(c, &emulation_tool(c, args)?)
                .map_err(|e| format!("{e}; this CPU is not of it ({why})"))?;
        }
    }
    std::fs::create_dir_all(out)?;
    // The child on an emulated CPU: this is the class's CPU, or it refuses.
    if let Some(name) = &args.as_class {
        let c = class(name)?;
        check_here(c)?;
        let file = file_for(out, &stem, c);
        let (entries, size) = pack_here(program, &args.data, &file)?;
        outln!(
            "{}: {entries} packed weights, {size} bytes: {}",
            c.name,
            file.display()
        );
        return Ok(());
    }
    for name in &args.cpus {
        let t = std::time::Instant::now();
        if name == "host" {
            let file = out.join(format!(
                "{stem}.host.{}",
                xnnblob::cache::CACHE_FILE_EXTENSION
            ));
            let (entries, size) = pack_here(program, &args.data, &file)?;
            outln!(
                "host: {entries} packed weights, {size} bytes: {} ({:.1} s)",
                file.display(),
                t.elapsed().as_secs_f64()
            );
            continue;
        }
        let c = class(name)?;
        if check_here(c).is_ok() {
            let file = file_for(out, &stem, c);
            let (entries, size) = pack_here(program, &args.data, &file)?;
            outln!(
                "{}: {entries} packed weights, {size} bytes: {} (this CPU, {:.1} s)",
                c.name,
                file.display(),
                t.elapsed().as_secs_f64()
            );
            continue;
        }
        let tool = emulation_tool(c, args)?;
        let mut command = emulated_command(c, &tool).map_err(|e| {
            format!(
                "{e}; this CPU is not of it ({})",
                check_here(c).err().unwrap_or_default()
            )
        })?;
        command.arg("prepack").arg(program);
        for d in &args.data {
            command.arg("--data").arg(d);
        }
        command
            .arg("--out")
            .arg(out)
            .args(["--name", &stem, "--as", c.name]);
        let done = command.output().map_err(|e| {
            format!(
                "class {}: cannot start {:?} ({e}): install qemu-user",
                c.name,
                command.get_program()
            )
        })?;
        if !done.status.success() {
            return Err(format!(
                "class {}: packing on the emulated CPU failed ({}): {}",
                c.name,
                done.status,
                String::from_utf8_lossy(&done.stderr).trim()
            )
            .into());
        }
        let said = String::from_utf8_lossy(&done.stdout);
        outln!(
            "{} (emulated, {:.1} s)",
            said.trim(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
