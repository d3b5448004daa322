//! A packed-weight cache file cut short in place by another process while a launch has it
//! mapped (issue 30, defect 4): the reads past its new end would raise SIGBUS and kill the
//! process. Here the execute that read them fails with `Truncated`, never giving outputs taken
//! as right; a program loaded again in the same process repacks what was lost, and the next
//! launch rebuilds the file.

use crate::common;

use common::scratch;
use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::{CacheError, CacheOptions};
use xnnblob::delegate::DelegateError;
use xnnblob::program::{Method, Program, ProgramError};
use xnnblob_test_support::synthetic::model::{self, Dtype, ModelFiles, ModelSpec, Preset};

const SPEC: ModelSpec = ModelSpec {
    preset: Preset::LlmLike,
    dtype: Dtype::Qd8,
    mib: 2,
    layers: 8,
};

fn backend() -> Backend {
    Backend::new(BackendOptions {
        cache_options: CacheOptions {
            blocking_save: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap()
}

fn load(backend: &Backend, files: &ModelFiles, cache: Option<&Path>) -> Program {
    let packed = match cache {
        Some(path) => WeightsCacheChoice::File(path.to_path_buf()),
        None => WeightsCacheChoice::Disabled,
    };
    Program::load(backend, &files.pte, &[&files.ptd], Some(&packed)).unwrap()
}

/// Creates `forward` (its runtimes) and executes it once.
fn execute(program: &Program) -> Result<Vec<f32>, ProgramError> {
    execute_method(&mut program.method("forward").unwrap())
}

fn execute_method(method: &mut Method) -> Result<Vec<f32>, ProgramError> {
    Ok(method.execute_f32(&[&SPEC.input()])?.remove(0))
}

/// Whether `error` is the cache's `Truncated`, as the execute reports it.
fn is_truncated(error: &ProgramError) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = source {
        if let Some(DelegateError::Cache(CacheError::Truncated { .. })) =
            e.downcast_ref::<DelegateError>()
        {
            return true;
        }
        source = e.source();
    }
    false
}

fn truncate(path: &Path, to: impl Fn(u64) -> u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(to(len)).unwrap();
}

fn cut_short_during_executes(name: &str, to: impl Fn(u64) -> u64) {
    let dir = scratch(name);
    let files = model::ensure(&SPEC, &dir.join("model")).unwrap();
    let reference = execute(&load(&backend(), &files, None)).unwrap();
    let cache: PathBuf = dir.join("w.xbc");
    {
        let b = backend();
        let cold = load(&b, &files, Some(&cache));
        assert_eq!(execute(&cold).unwrap(), reference, "cold");
        cold.weights_cache().unwrap().finalize().unwrap();
    }

    let b = backend();
    let warm = load(&b, &files, Some(&cache));
    let mut forward = warm.method("forward").unwrap();
    assert_eq!(
        execute_method(&mut forward).unwrap(),
        reference,
        "warm, before the cut"
    );
    assert_eq!(warm.weights_cache().unwrap().stats().packed, 0, "warm");
    truncate(&cache, &to);
    for round in 0..3 {
        match execute_method(&mut forward) {
            Err(e) => assert!(is_truncated(&e), "round {round}: {e}"),
            Ok(out) => panic!("round {round}: outputs from zeroed weights were given: {out:?}"),
        }
    }
    let stats = warm.weights_cache().unwrap().stats();
    assert!(stats.truncated > 0, "{stats:?}");

    // The same process creates the method again: what was lost is packed anew.
    assert_eq!(execute(&warm).unwrap(), reference, "created again");
    let again = load(&b, &files, Some(&cache));
    assert_eq!(execute(&again).unwrap(), reference, "loaded again");
    drop((forward, warm, again));
    drop(b);

    // The next launch finds the file cut short, rebuilds it, and the one after is warm.
    {
        let b = backend();
        let next = load(&b, &files, Some(&cache));
        assert_eq!(execute(&next).unwrap(), reference, "next launch");
        next.weights_cache().unwrap().finalize().unwrap();
    }
    let b = backend();
    let after = load(&b, &files, Some(&cache));
    assert_eq!(execute(&after).unwrap(), reference, "warm again");
    assert_eq!(
        after.weights_cache().unwrap().stats().packed,
        0,
        "warm again"
    );
}

#[test]
fn a_cache_file_cut_to_nothing_during_executes_fails_them_without_sigbus() {
    cut_short_during_executes("cut-to-zero", |_| 0);
}

#[test]
fn a_cache_file_cut_in_half_during_executes_fails_them_without_sigbus() {
    cut_short_during_executes("cut-in-half", |len| len / 2);
}

#[test]
fn a_cache_file_losing_its_last_4_kib_during_executes_fails_them_without_sigbus() {
    cut_short_during_executes("cut-4-kib", |len| len - 4096);
}

/// A SIGBUS outside any cache map is not the cache's to absorb: the process dies of it, as it
/// would without xnnblob (a child process maps a file, truncates it, and reads past the end).
#[test]
fn a_sigbus_outside_the_cache_still_kills_the_process() {
    // The child dies of the signal, so the parent's scratch directory, named to it, is the one
    // removed afterwards.
    if let Some(dir) = std::env::var_os("XNNBLOB_SIGBUS_CHILD") {
        let dir = std::path::PathBuf::from(dir);
        let b = backend();
        // The cache's handler is installed by a warm map.
        let files = model::ensure(&SPEC, &dir.join("model")).unwrap();
        let cache = dir.join("w.xbc");
        let p = load(&b, &files, Some(&cache));
        execute(&p).unwrap();
        p.weights_cache().unwrap().finalize().unwrap();
        drop(p);
        let _warm = load(&b, &files, Some(&cache));
        let path = dir.join("other");
        std::fs::write(&path, vec![1u8; 1 << 16]).unwrap();
        let map = xnnblob::mmap::MappedFile::open(&path).unwrap();
        truncate(&path, |_| 0);
        let byte = std::hint::black_box(map.bytes())[1 << 15];
        println!("read {byte} past the end and lived");
        return;
    }
    let dir = scratch("foreign-sigbus");
    let out = crate::common::this_test_binary()
        .args([
            "--exact",
            &crate::common::test_path(
                module_path!(),
                "a_sigbus_outside_the_cache_still_kills_the_process",
            ),
            "--nocapture",
        ])
        .env("XNNBLOB_SIGBUS_CHILD", &*dir)
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}
