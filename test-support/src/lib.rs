//! What xnnblob's test suites share (the core's, the command line's, the faces' and the
//! drop-in's): where ExecuTorch's exported fixtures are, how their raw f32 files and manifests
//! read, scratch directories, comparisons, a plain Rust reference for quantized graphs, cross
//! builds for aarch64, the drop-in's runner and programs ([`drop_in`]), and how a test that
//! cannot run here says so. It ships in nothing.

pub mod bounded;
pub mod builder;
pub mod cache_files;
pub mod close;
pub mod counting;
pub mod cross;
pub mod drop_in;
pub mod faults;
pub mod half;
pub mod io_steps;
pub mod program_writer;
pub mod qd8_reference;
mod skip;
pub mod synthetic;

pub use skip::{MUST_RUN_VAR, cannot_run};

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The name libtest knows test `name` of module `module` (its `module_path!()`) by, for a child
/// process that runs only that test (`--exact`): the module path without the crate's name.
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, inner)) => format!("{inner}::{name}"),
        None => name.to_string(),
    }
}

/// The repository's root, where the core crate is: the tests of the command line (`cli/`) and
/// of the faces (`faces/checks/`) share these helpers and its fixtures.
pub fn repo_root() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("tests/data/executorch").is_dir())
        .unwrap_or(manifest)
}

/// `tests/data/executorch`, the fixtures copied from ExecuTorch 1.5.1's exporter.
pub fn dir() -> PathBuf {
    repo_root().join("tests/data/executorch")
}

/// The XNNPACK fixtures of [`dir`], by name (`NAME.pte`, `NAME.json`).
pub const XNNPACK_FIXTURES: [&str; 8] = [
    "mlp_xnn_inline",
    "mlp_xnn_external",
    "two_methods_xnn_external",
    "cnn_xnn_external",
    "mlp_qd8_qc8w_external",
    "mlp_qc4w_inline",
    "mlp_qb4w_inline",
    "mlp_qb4w_gk_inline",
];

/// The programs of `scripts/export-executorch-fixtures.py` described by an `NAME.io.json` in
/// `export/` under [`dir`] (steps of one method), sorted by name.
pub fn exported_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir().join("export"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".io.json").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// A raw little-endian f32 file.
/// How many nodes of the `kinds` (ExecuTorch's schema names: `XNNConv2d`, ...) the XNNPACK
/// delegates of the program at `pte` hold, every method counted.
pub fn delegate_nodes(pte: &Path, kinds: &[&str]) -> usize {
    let map = xnnblob::named_data::FileDataMap::open_pte(pte).unwrap();
    xnnblob::program::delegate_payloads(&map)
        .unwrap()
        .iter()
        .flat_map(|(_, payloads)| payloads)
        .flat_map(|p| xnnblob::delegate::summarize(p).unwrap().nodes)
        .filter(|(kind, _, _)| kinds.contains(&kind.as_str()))
        .map(|(_, n, _)| n)
        .sum()
}

pub fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The manifest `NAME.json` of a fixture.
pub fn manifest(name: &str) -> Value {
    let path = dir().join(format!("{name}.json"));
    serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// The XNNPACK weight types (`qd8_f32_qc8w`, ...) a fixture's delegate runs fully connected
/// layers with, read from its decoded payload.
pub fn qd8_weight_types(manifest: &Value) -> Vec<xnnblob::xnn::Qd8Weights> {
    use xnnblob::xnn::Qd8Weights;
    let Some(types) = manifest["delegates"][0]["value_datatypes"].as_object() else {
        return Vec::new();
    };
    if !types.contains_key("xnn_datatype_qdint8") {
        return Vec::new();
    }
    Qd8Weights::ALL
        .into_iter()
        .filter(|w| {
            let dt = match w {
                Qd8Weights::Qc8w => "xnn_datatype_qcint8",
                Qd8Weights::Qc4w => "xnn_datatype_qcint4",
                Qd8Weights::Qb4w => "xnn_datatype_qbint4",
            };
            types.contains_key(dt)
        })
        .collect()
}

/// One line naming the microkernel XNNPACK runs each of these weight types with on this CPU.
pub fn kernels_line(weights: &[xnnblob::xnn::Qd8Weights]) -> String {
    weights
        .iter()
        .map(|w| {
            let name = xnnblob::xnn::qd8_gemm_kernel(*w)
                .ok()
                .flatten()
                .unwrap_or_else(|| "unknown (XNNPACK not built by xnnpack-sys)".into());
            format!("{} on {name}", w.operator_name())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// max |a - b| and max |b| (the range the difference is judged against).
pub fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len(), "output lengths");
    let range = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    (close::max_abs_difference(a, b), range)
}

/// Set in a test binary re-run under emulation, so that its own emulation tests do not recurse.
pub const EMULATED_CPU_VAR: &str = "XNNBLOB_EMULATED_CPU";

/// A command that starts the program a test binary's child must be started by, when the binary
/// was built for another CPU (tests/aarch64.rs: `qemu-aarch64 -cpu ... -L ...`), as whitespace-
/// separated words. Unset, children start directly (or through the kernel's binfmt).
pub const TEST_RUNNER_VAR: &str = "XNNBLOB_TEST_RUNNER";

/// A command that runs this test binary again, as a child: through [`TEST_RUNNER_VAR`]'s
/// runner when one is set.
pub fn this_test_binary() -> std::process::Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let runner = std::env::var(TEST_RUNNER_VAR).unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut command = std::process::Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => std::process::Command::new(exe),
    }
}

/// Whether this process is the re-run of [`assert_pass_on_emulated_cpu`].
pub fn under_emulation() -> bool {
    std::env::var_os(EMULATED_CPU_VAR).is_some()
}

/// Re-runs `tests` of this test binary (tests of `module`, the caller's `module_path!()`) under
/// `qemu-x86_64 -cpu <cpu>`, so that XNNPACK dispatches as on that CPU class (qemu's CPUID and
/// instruction set), and asserts that they pass and that every quantized GEMM ran on a kernel
/// whose name contains `kernel_isa` (proof the emulated CPU changed the dispatch). This
/// machine's own CPU class is covered by the plain run. On a host that is not x86-64 it cannot
/// run, and says so ([`cannot_run`]); in the re-run itself it does nothing.
#[track_caller]
pub fn assert_pass_on_emulated_cpu(module: &str, cpu: &str, kernel_isa: &str, tests: &[&str]) {
    // The re-run itself: its own emulation tests would recurse.
    if under_emulation() {
        return;
    }
    // x86-64 CPU classes only: aarch64's are tests/aarch64.rs's.
    if !cfg!(target_arch = "x86_64") {
        cannot_run(&format!(
            "{tests:?} under qemu-x86_64 -cpu {cpu}: that needs an x86-64 test binary"
        ));
        return;
    }
    let tests: Vec<String> = tests.iter().map(|t| test_path(module, t)).collect();
    let qemu = "qemu-x86_64";
    let exe = std::env::current_exe().expect("the test binary's path");
    // A few tests under emulation take seconds: ten minutes is a hang, failed as one.
    let out = bounded::output(
        std::process::Command::new(qemu)
            .args(["-cpu", cpu])
            .arg(&exe)
            .args(&tests)
            .args(["--exact", "--nocapture", "--test-threads=1"])
            .env(EMULATED_CPU_VAR, cpu),
        std::time::Duration::from_secs(600),
        &format!(
            "{tests:?} under {qemu} -cpu {cpu} (install qemu-user with ./scripts/install-system-deps.sh)"
        ),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("--- under {qemu} -cpu {cpu} ---\n{text}");
    assert!(
        out.status.success(),
        "{tests:?} failed on an emulated {cpu}"
    );
    assert!(
        text.contains(&format!("test result: ok. {} passed", tests.len())),
        "{tests:?} did not all run on the emulated {cpu}"
    );
    let kernels: Vec<&str> = text
        .split_whitespace()
        .filter(|w| w.starts_with("xnn_qd8_f32_q") || w.starts_with("xnnblob_qd8_f32_q"))
        .collect();
    assert!(
        !kernels.is_empty(),
        "no quantized kernel was named under {cpu}"
    );
    for k in &kernels {
        assert!(
            k.contains(kernel_isa),
            "{k} ran on the emulated {cpu}, not a {kernel_isa} kernel"
        );
    }
}

/// A model context of `backend` with xnnblob's packed-weight cache `weights` (None: no cache).
pub fn model_of(
    backend: &xnnblob::backend::Backend,
    weights: Option<std::sync::Arc<xnnblob::cache::PackedWeightsCache>>,
) -> xnnblob::backend::ModelContext {
    let weights = weights.map_or(
        xnnblob::delegate::Weights::None,
        xnnblob::delegate::Weights::Packed,
    );
    backend.model_with_weights(weights).unwrap()
}

/// A backend with the default options.
pub fn new_backend() -> xnnblob::backend::Backend {
    xnnblob::backend::Backend::with_defaults().unwrap()
}

/// Registers the weights and bias of every layer of `models` with `cache` under their content
/// ids, as a model load does before it creates runtimes.
pub fn register_mlps<'a>(
    cache: &'a xnnblob::cache::PackedWeightsCache,
    models: &[&'a crate::synthetic::Mlp],
) -> Vec<xnnblob::cache::Registration<'a>> {
    use xnnblob::cache::BlobId;
    models
        .iter()
        .flat_map(|m| &m.layers)
        .flat_map(|l| {
            [
                cache.register(&l.weights, BlobId::of_f32s(&l.weights)),
                cache.register(&l.bias, BlobId::of_f32s(&l.bias)),
            ]
        })
        .collect()
}

/// Writes into `dir` a copy of the fixture `mlp_xnn_external.ptd` with the floats of its first
/// weight negated in place and its keys unchanged (what a hand edit after export leaves, finding
/// 4 of issue 17). Returns the copy's path and the edited key.
pub fn ptd_with_first_weight_negated(dir: &Path) -> (PathBuf, String) {
    use xnnblob::named_data::{FileDataMap, NamedDataMap};
    let fixture = self::dir().join("mlp_xnn_external.ptd");
    let map = FileDataMap::open(&fixture).unwrap();
    let key = map.key_at(0).unwrap().to_string();
    let blob = map.get_data(&key).unwrap().data().to_vec();
    let mut bytes = std::fs::read(&fixture).unwrap();
    let at = bytes
        .windows(blob.len())
        .position(|w| w == blob.as_slice())
        .unwrap();
    for b in bytes[at + 3..at + blob.len()].iter_mut().step_by(4) {
        *b ^= 0x80;
    }
    let edited = dir.join("edited.ptd");
    std::fs::write(&edited, &bytes).unwrap();
    (edited, key)
}

mod scratch;
pub use scratch::{Scratch, Tmpfs, scratch, without_permission_override};
