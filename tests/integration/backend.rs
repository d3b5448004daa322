//! The backend object: one cache object per file (a conflicting second open is an error),
//! workspace sharing and the thread pool give the same outputs, concurrently too.

use crate::common;

use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice, WorkspaceSharing};
use xnnblob::cache::{CacheError, CacheOptions, PackedWeightsCache};
use xnnblob::program::Program;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/runtime-c")
}

fn f32_file(name: &str) -> Vec<f32> {
    std::fs::read(dir().join(name))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Runs c_shared_a and c_shared_b through `backend`, interleaved, and checks both against
/// ExecuTorch's outputs.
fn run_both(backend: &Backend) {
    let load = |name: &str| {
        Program::load(
            backend,
            dir().join(format!("{name}.pte")),
            &[dir().join(format!("{name}.ptd"))],
            None,
        )
        .unwrap()
    };
    let (a, b) = (
        load("c_shared_a_xnn_external"),
        load("c_shared_b_xnn_external"),
    );
    let (mut ma, mut mb) = (a.method("forward").unwrap(), b.method("forward").unwrap());
    for _ in 0..3 {
        for (m, name) in [
            (&mut ma, "c_shared_a_xnn_external"),
            (&mut mb, "c_shared_b_xnn_external"),
        ] {
            let input = f32_file(&format!("{name}.s0.in0.bin"));
            let out = m.execute_f32(&[&input]).unwrap().remove(0);
            let want = f32_file(&format!("{name}.s0.out_et0.bin"));
            assert_eq!(out.len(), want.len(), "{name}");
            common::close::assert_close(
                &out,
                &want,
                common::close::Tolerance::Absolute(1e-5),
                name,
            );
        }
    }
}

#[test]
fn every_workspace_sharing_mode_and_a_thread_pool_give_the_same_outputs() {
    for sharing in [
        WorkspaceSharing::Disabled,
        WorkspaceSharing::PerModel,
        WorkspaceSharing::Global,
    ] {
        for threads in [1, 2] {
            let backend = Backend::new(BackendOptions {
                workspace_sharing: sharing,
                threads,
                ..Default::default()
            })
            .unwrap();
            run_both(&backend);
        }
    }
}

#[test]
fn a_globally_shared_workspace_is_used_by_one_runtime_at_a_time() {
    let backend = Backend::new(BackendOptions {
        workspace_sharing: WorkspaceSharing::Global,
        ..Default::default()
    })
    .unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| run_both(&backend));
        }
    });
}

#[test]
fn a_second_open_of_a_file_with_other_options_is_an_error() {
    let dir = common::scratch("backend");
    let path = dir.join("weights.xbc");
    let first = PackedWeightsCache::open(&path).unwrap();
    let same = PackedWeightsCache::open(&path).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&first, &same),
        "one cache object per file"
    );
    let other = CacheOptions {
        blocking_save: true,
        ..Default::default()
    };
    let err = PackedWeightsCache::open_with(&path, other.clone())
        .err()
        .unwrap();
    assert!(
        matches!(err, CacheError::OpenWithOtherOptions { .. }),
        "{err}"
    );
    // Through a backend too, whose options say otherwise.
    let backend = Backend::new(BackendOptions {
        cache_options: other,
        ..Default::default()
    })
    .unwrap();
    let err = backend
        .model(Some(&WeightsCacheChoice::File(path.clone())))
        .err()
        .unwrap();
    assert!(err.to_string().contains("other options"), "{err}");
    assert!(
        matches!(err, xnnblob::backend::BackendError::Cache(_)),
        "the cache error is kept: {err:?}"
    );
    drop((first, same));
    // Once closed, the file opens with any options.
    assert!(
        PackedWeightsCache::open_with(
            &path,
            CacheOptions {
                blocking_save: true,
                ..Default::default()
            }
        )
        .is_ok()
    );
    let _ = std::fs::remove_file(&path);
}

/// Every face resolves a cache request through `Backend::resolve_weights`: a path that cannot
/// be used leaves the weights in memory with a notice (ExecuTorch's way), and is
/// `Backend::model`'s error (a caller that named a file expects it to persist); a file that
/// was rejected is rebuilt, and says why.
#[test]
fn one_resolver_says_what_became_of_a_cache_request() {
    use xnnblob::backend::CacheNotice;
    use xnnblob::delegate::Weights;
    let backend = Backend::with_defaults().unwrap();
    let scratch = common::scratch("resolver");

    let a_directory = WeightsCacheChoice::File(scratch.to_path_buf());
    let (weights, notice) = backend.resolve_weights(&a_directory, false);
    match (&weights, &notice) {
        (Weights::Packed(cache), Some(CacheNotice::Unusable { path, .. })) => {
            assert!(std::sync::Arc::ptr_eq(cache, backend.in_memory_cache()));
            assert_eq!(path, &scratch.to_path_buf());
        }
        (_, notice) => panic!("not in memory with a notice: {notice:?}"),
    }
    assert!(notice.unwrap().to_string().contains("kept in memory"));
    assert!(backend.model(Some(&a_directory)).is_err());

    let torn = scratch.join("empty.xbc");
    std::fs::write(&torn, b"").unwrap();
    let (weights, notice) = backend.resolve_weights(&WeightsCacheChoice::File(torn.clone()), false);
    assert!(matches!(weights, Weights::Packed(_)));
    match notice {
        Some(CacheNotice::Rebuilt { path, why }) => {
            assert_eq!(path, torn);
            assert!(why.contains("rejected"), "{why}");
        }
        other => panic!("{other:?}"),
    }

    let fresh = WeightsCacheChoice::File(scratch.join("new.xbc"));
    assert!(backend.resolve_weights(&fresh, false).1.is_none());
    assert!(matches!(
        backend.resolve_weights(&WeightsCacheChoice::Disabled, false),
        (Weights::None, None)
    ));
}
