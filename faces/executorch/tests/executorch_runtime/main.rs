//! ExecuTorch 1.5.1's own runtime (the wheel's Module, executor, memory planning and kernels)
//! running programs through xnnblob's "XnnpackBackend", with ExecuTorch's own XNNPACK backend as
//! the witness in the same test. Each launch is a fresh `xnnblob-et-run` process.

use xnnblob_test_support::close::relative_difference;
use xnnblob_test_support::drop_in::programs::{
    Run, Runner, check_outputs, data, exported_programs, f16s, fixture_programs, io_program,
    measure, mlp_args, runtime_c, runtime_c_programs, s, sharing_program_matches_eager,
    sharing_programs,
};
use xnnblob_test_support::drop_in::{self, f32s};
use xnnblob_test_support::io_steps::{self, call_arg};
use xnnblob_test_support::scratch;

use std::path::{Path, PathBuf};
use std::process::Command;

mod bundles;
mod faults;
mod loads;
mod methods;
mod outputs;
mod threads;

/// The drop-in's runner, where cargo built it for these tests (the backend library is built
/// beside it).
const ET_RUN: &str = env!("CARGO_BIN_EXE_xnnblob-et-run");

fn runner(args: &[String]) -> Result<Run, String> {
    Runner::host(ET_RUN, None).run(args)
}

fn run_ok(args: &[String]) -> Run {
    runner(args).unwrap_or_else(|e| panic!("xnnblob-et-run {args:?} failed: {e}"))
}

/// One launch of `mlp_qd8_qc8w_external` with the cache file `cache`, its outputs written under
/// `dir/tag`: the output, the runner's stdout and its stderr.
fn launch_mlp(dir: &Path, cache: &Path, tag: &str) -> (Vec<f32>, String, String) {
    let out = dir.join(tag);
    std::fs::create_dir_all(&out).unwrap();
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        cache.display().to_string(),
        s("--output-dir"),
        out.display().to_string(),
    ]);
    let (ok, stdout, stderr) = run_any(&args);
    assert!(ok, "{tag}: {stdout}{stderr}");
    (
        f32s(&std::fs::read(out.join("output0.f32")).unwrap()),
        stdout,
        stderr,
    )
}

/// A peer bench model at `mib`, written into `dir`, with an input file: its runner arguments.
fn bench_model(spec: xnnblob_test_support::synthetic::model::ModelSpec, dir: &Path) -> Vec<String> {
    let files = xnnblob_test_support::synthetic::model::ensure(&spec, dir).unwrap();
    let input_path = dir.join(format!("{}.input.f32", spec.name()));
    spec.write_input(&input_path).unwrap();
    vec![
        files.pte.display().to_string(),
        s("--data"),
        files.ptd.display().to_string(),
        s("--input"),
        input_path.display().to_string(),
    ]
}

/// A launch of the runner with `args` and `--wait-between-executes`, started and waiting after
/// its first execute for a line on its stdin: the child (stdin and stdout piped), its stderr,
/// and what it said there so far. `what` names the launch in a failure.
fn launch_waiting(
    args: &[String],
    what: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
    String,
) {
    use std::io::BufRead;
    use std::process::Stdio;
    drop_in::backend_library(ET_RUN);
    let mut child = Command::new(ET_RUN)
        .args(args)
        .arg("--wait-between-executes")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("waiting for a line") {
        let before = said.len();
        stderr.read_line(&mut said).unwrap();
        assert!(
            said.len() > before,
            "{what}: the runner ended early: {said}"
        );
    }
    (child, stderr, said)
}

/// Runs the runner and returns its exit status, stdout and stderr, however it ended.
fn run_any(args: &[String]) -> (bool, String, String) {
    drop_in::backend_library(ET_RUN);
    let out = Command::new(ET_RUN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
