//! `xnnblob run --cache` with hostile side files and private models (issue 38, items 4 and 5):
//! a FIFO at `PATH.lock` or `PATH.checked` never makes a launch wait, and the cache of a model
//! whose files are private is private, with its lock and check record; an existing cache more
//! readable than its model is said.

use crate::common;

use common::scratch;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs `xnnblob run` with `args` and returns whether it succeeded, and its stdout and stderr;
/// fails the test if it never finishes (`common::bounded`).
fn run_bounded(args: &[&str]) -> (bool, String) {
    let stdout = tempfile::NamedTempFile::new().unwrap();
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut child = crate::xnnblob()
        .arg("run")
        .args(args)
        .stdout(stdout.reopen().unwrap())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .unwrap();
    let status = common::bounded::wait(&mut child, &format!("xnnblob run {args:?}"));
    let text = std::fs::read_to_string(stdout.path()).unwrap()
        + &std::fs::read_to_string(stderr.path()).unwrap();
    (status.success(), text)
}

/// The MLP fixture copied into `dir` with permission bits `mode` on its `.pte` and `.ptd`.
struct Model {
    pte: PathBuf,
    ptd: PathBuf,
    input: PathBuf,
}

fn model_with_mode(dir: &Path, mode: u32) -> Model {
    let fixtures = common::dir();
    let model = Model {
        pte: dir.join("model.pte"),
        ptd: dir.join("model.ptd"),
        input: fixtures.join("mlp.input.f32"),
    };
    std::fs::copy(fixtures.join("mlp_xnn_external.pte"), &model.pte).unwrap();
    std::fs::copy(fixtures.join("mlp_xnn_external.ptd"), &model.ptd).unwrap();
    for file in [&model.pte, &model.ptd] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    model
}

fn run_with_cache(model: &Model, cache: &Path) -> (bool, String) {
    run_bounded(&[
        model.pte.to_str().unwrap(),
        "--data",
        model.ptd.to_str().unwrap(),
        "--input",
        model.input.to_str().unwrap(),
        "--cache",
        cache.to_str().unwrap(),
    ])
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Issue 38: `xnnblob run` made the cache of a 0600 model, and its lock, 0644.
#[test]
fn run_with_a_private_model_makes_a_private_cache_lock_and_check_record() {
    let dir = scratch("run-private");
    let model = model_with_mode(&dir, 0o600);
    let cache = dir.join("w.xbc");
    let (ok, text) = run_with_cache(&model, &cache);
    assert!(ok, "{text}");
    assert!(!text.contains("warning"), "{text}");
    // Unchanged for 2 s, the file is checked by the next launch, and the check recorded.
    std::thread::sleep(Duration::from_millis(2300));
    let (ok, text) = run_with_cache(&model, &cache);
    assert!(ok && text.contains("(0 weights packed"), "warm: {text}");
    let record = sibling(&cache, ".checked");
    assert!(record.is_file(), "the check was recorded: {text}");
    for file in [cache.clone(), sibling(&cache, ".lock"), record] {
        let mode = mode_of(&file);
        assert_eq!(mode & 0o077, 0, "{}: {mode:o}", file.display());
    }
}

#[test]
fn run_says_when_an_existing_cache_is_more_readable_than_its_model() {
    let dir = scratch("run-too-readable");
    let model = model_with_mode(&dir, 0o600);
    let cache = dir.join("w.xbc");
    let (ok, text) = run_with_cache(&model, &cache);
    assert!(ok, "{text}");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, text) = run_with_cache(&model, &cache);
    assert!(
        ok && text.contains("(0 weights packed"),
        "used warm: {text}"
    );
    assert_eq!(
        text.matches("more readable than the model").count(),
        1,
        "said once: {text}"
    );
    assert!(text.contains(cache.to_str().unwrap()), "{text}");
}

/// Issue 38: a cold launch blocked forever opening a FIFO at `PATH.lock`; a warm one reading a
/// FIFO at `PATH.checked`.
#[test]
fn run_never_waits_on_a_fifo_beside_the_cache() {
    let dir = scratch("run-fifos");
    let model = model_with_mode(&dir, 0o644);
    let cache = dir.join("w.xbc");
    let lock = sibling(&cache, ".lock");
    mkfifo(&lock);
    let (ok, text) = run_with_cache(&model, &cache);
    assert!(ok, "runs from memory: {text}");
    assert!(
        text.contains("w.xbc.lock") && text.contains("a FIFO, not a regular file"),
        "the save says why: {text}"
    );
    assert!(!cache.exists());
    std::fs::remove_file(&lock).unwrap();

    let (ok, text) = run_with_cache(&model, &cache);
    assert!(ok && cache.is_file(), "{text}");
    let record = sibling(&cache, ".checked");
    // The cold launch's save recorded its file as checked: a FIFO takes the record's place.
    std::fs::remove_file(&record).unwrap();
    mkfifo(&record);
    let (ok, text) = run_with_cache(&model, &cache);
    assert!(ok && text.contains("(0 weights packed"), "warm: {text}");
    assert!(
        std::fs::symlink_metadata(&record)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}
