//! The `xnnblob` command line.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use xnnblob::named_data::FileDataMap;

mod inspect;
mod prepack;
use xnnblob::report::{exit_code, report};

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

mod run;
use run::RunArgs;

/// Fast, lean model loading for XNNPACK: run ExecuTorch programs with a persistent packed-weight
/// cache, pack caches ahead of time, inspect their named data, link weights into binaries.
/// (The demo and the benchmarks are `xnnblob-lab`'s.)
#[derive(Parser)]
#[command(name = "xnnblob", version, about)]
#[command(arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
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
            run::run(&args, run)
        }
        Command::Prepack(args) => prepack_command(&args),
    };
    // A reader of stdout that went away ends the output only: the outputs and the cache are done.
    exit_code("xnnblob", result)
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

fn cache_command(action: CacheAction) -> Result<(), Box<dyn std::error::Error>> {
    use xnnblob::cache::{CacheOptions, compact_file, verify_file};
    let options = CacheOptions::default();
    let (report, path, verify) = match &action {
        CacheAction::Stats { path } => (verify_file(path, &options, false, false)?, path, false),
        CacheAction::Verify { path, .. } => (verify_file(path, &options, true, true)?, path, true),
        CacheAction::Compact { path } => (compact_file(path, &options)?, path, false),
    };
    let report = report.map_err(|e| {
        format!(
            "{}: would be rebuilt: {}",
            path.display(),
            xnnblob::report::Report(&e)
        )
    })?;
    outln!(
        "{}: {} entries, {} packed bytes, file {} bytes ({:.3}x packed), {} invalid entries, \
         {} kept constants",
        path.display(),
        report.entries,
        report.packed_bytes,
        report.file_size,
        report.file_size as f64 / report.packed_bytes.max(1) as f64,
        report.invalid_entries,
        report.kept_constants
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
    use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
    use xnnblob::program::{Program, ProgramError};
    let backend = Backend::new(BackendOptions::default())?;
    let loaded = Program::load(
        &backend,
        program,
        data,
        Some(&WeightsCacheChoice::File(path.to_path_buf())),
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
            return Err(format!("class {}: run prepack on an x86-64 host", c.name).into());
        }
    })
}

fn prepack_command(args: &PrepackArgs) -> Result<(), Box<dyn std::error::Error>> {
    use prepack::{CLASSES, check_here, class, emulated_command, file_for};
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
