//! `xnnblob-lab`: the demo, the benchmarks and the crash torture, apart from the installed
//! `xnnblob` command line (which links none of this, nor the synthetic models and the fault
//! injector they use).

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use xnnblob::report::exit_code;

/// Writes a line to stdout, returning the error instead of panicking: a reader that goes away
/// (`| head`) ends the output, and [`main`] treats the broken pipe as a normal end.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)?
    }};
}

/// xnnblob's lab: the demo, the load, peer and prefill benchmarks, and the crash torture.
#[derive(Parser)]
#[command(name = "xnnblob-lab", version, about)]
struct Lab {
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
    /// The load benchmark: no cache, XNNPACK's cache, xnnblob cold and warm, the floor; the
    /// peer benchmark against ExecuTorch's own backend (`--peer`); `prefill`; or `compare` two
    /// bench results.
    Bench(Box<BenchCommand>),
    /// A kill -9 campaign: launches of a generated model (`xnnblob run`) killed at random
    /// moments (packing, saving, renaming); after each kill a launch must complete with the
    /// outputs of a run without cache and the file must verify; at the end the file must be the
    /// size of one built from scratch with no temporary file left. Prints the counts; exits 1 if
    /// a promise broke.
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
        /// The `xnnblob` command the launches run [default: the one beside this program].
        #[arg(long)]
        xnnblob: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCommand {
    #[command(subcommand)]
    action: Option<BenchAction>,
    #[command(flatten)]
    args: xnnblob_lab::bench::BenchArgs,
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
        /// one that emulates SME2 (benches/qemu/build-qemu.sh); the report names its version.
        #[arg(long)]
        qemu: Option<PathBuf>,
        /// Refuse the timed launches Linux's grant of AMX tile data, so that on an AMX machine
        /// both backends run their AVX-512 kernels (the class below AMX, on the same cores).
        #[arg(long)]
        refuse_amx: bool,
        /// Where the programs and the reports go.
        #[arg(long, default_value = "target/bench/prefill")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let matches = Lab::command().get_matches();
    let lab = match Lab::from_arg_matches(&matches) {
        Ok(lab) => lab,
        Err(e) => e.exit(),
    };
    let result = match lab.command.unwrap_or(Command::Demo { mib: 256 }) {
        Command::Demo { mib } => xnnblob_lab::bench::demo(mib).map_err(Into::into),
        Command::Bench(bench) => match *bench {
            BenchCommand {
                action: Some(action),
                ..
            } => match bench_action(action) {
                Ok(Outcome::Regressed) => return ExitCode::FAILURE,
                other => other.map(|_| ()),
            },
            BenchCommand { args, .. } => xnnblob_lab::bench::main(&args, true).map_err(Into::into),
        },
        Command::Torture {
            kills,
            mib,
            seed,
            dir,
            xnnblob,
        } => torture(kills, mib, seed, dir, xnnblob),
    };
    exit_code("xnnblob-lab", result)
}

/// How a bench action ended, besides failing.
enum Outcome {
    Done,
    /// `compare` found a regression beyond the threshold (its report printed).
    Regressed,
}

fn bench_action(action: BenchAction) -> Result<Outcome, Box<dyn std::error::Error>> {
    match action {
        BenchAction::Compare {
            base,
            new,
            max_regression,
        } => {
            let (report, regressed) =
                xnnblob_lab::bench::compare::compare(&base, &new, max_regression)?;
            // `report` ends with its own newline.
            {
                use std::io::Write as _;
                write!(std::io::stdout(), "{report}")?;
            }
            Ok(if regressed {
                Outcome::Regressed
            } else {
                Outcome::Done
            })
        }
        BenchAction::Prefill {
            tokens,
            repeats,
            executes,
            aarch64,
            qemu,
            refuse_amx,
            out,
        } => {
            let runner = xnnblob_lab::bench::peer::runner_near_executable()?;
            let results =
                xnnblob_lab::bench::prefill::run(&xnnblob_lab::bench::prefill::PrefillOptions {
                    runner,
                    tokens,
                    repeats,
                    executes,
                    // A comma separates CPUs, so a model's features are written with ';'.
                    aarch64: aarch64.iter().map(|c| c.replace(';', ",")).collect(),
                    qemu,
                    refuse_amx,
                    out,
                })?;
            {
                use std::io::Write as _;
                write!(
                    std::io::stdout(),
                    "{}",
                    xnnblob_lab::bench::prefill::markdown(&results)
                )?;
            }
            Ok(Outcome::Done)
        }
    }
}

/// The torture campaign in `dir`, or in a temporary directory it removes after.
fn torture(
    kills: usize,
    mib: usize,
    seed: u64,
    dir: Option<PathBuf>,
    xnnblob: Option<PathBuf>,
) -> Result<(), Box<dyn std::error::Error>> {
    let exe = match xnnblob {
        Some(exe) => exe,
        None => std::env::current_exe()?.with_file_name("xnnblob"),
    };
    if !exe.is_file() {
        return Err(format!(
            "{} is not built (cargo build --release -p xnnblob-cli), or name it with --xnnblob",
            exe.display()
        )
        .into());
    }
    let scratch = dir
        .is_none()
        .then(|| std::env::temp_dir().join(format!("xnnblob-torture-{}", std::process::id())));
    let run_dir = dir.or(scratch.clone()).unwrap_or_default();
    let report = xnnblob_lab::torture::torture(&xnnblob_lab::torture::TortureOptions {
        kills,
        mib,
        seed,
        dir: run_dir,
        exe,
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
