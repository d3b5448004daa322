//! Named keys are checked against their bytes once per data file (`KeyTrust::CheckEachFile`, the
//! default): a `.ptd` edited after export, with its keys unchanged, must not get the original's
//! packing from a warm cache (finding 4 of issue 17); an unchanged file is checked once and then
//! trusted, so later warm launches hash nothing.

use crate::common;

use common::{dir, f32s, ptd_with_first_weight_negated, scratch};
use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::{CacheOptions, CacheStats, KeyTrust};
use xnnblob::program::Program;

fn pte() -> PathBuf {
    dir().join("mlp_xnn_external.pte")
}

/// One launch in a fresh backend: the outputs of `forward`, and the cache's stats.
fn launch(ptd: &Path, cache: &Path, key_trust: KeyTrust) -> (Vec<f32>, CacheStats) {
    let backend = Backend::new(BackendOptions {
        cache_options: CacheOptions {
            key_trust,
            blocking_save: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let program = Program::load(
        &backend,
        pte(),
        &[ptd],
        Some(&WeightsCacheChoice::File(cache.to_path_buf())),
    )
    .unwrap();
    let input = f32s(&dir().join("mlp.input.f32"));
    let out = program
        .method("forward")
        .unwrap()
        .execute_f32(&[&input])
        .unwrap()
        .remove(0);
    let weights = program.weights_cache().unwrap().clone();
    weights.finalize().unwrap();
    let stats = weights.stats();
    drop(program);
    (out, stats)
}

/// Outputs without any cache.
fn uncached(ptd: &Path) -> Vec<f32> {
    let backend = Backend::with_defaults().unwrap();
    let program =
        Program::load(&backend, pte(), &[ptd], Some(&WeightsCacheChoice::Disabled)).unwrap();
    let input = f32s(&dir().join("mlp.input.f32"));
    program
        .method("forward")
        .unwrap()
        .execute_f32(&[&input])
        .unwrap()
        .remove(0)
}

#[test]
fn a_ptd_edited_after_export_never_gets_the_originals_packing() {
    let scratch = scratch("edited-ptd");
    let original = scratch.join("model.ptd");
    std::fs::copy(dir().join("mlp_xnn_external.ptd"), &original).unwrap();
    let (edited, _) = ptd_with_first_weight_negated(&scratch);
    let cache = scratch.join("w.xbc");

    let (cold, stats) = launch(&original, &cache, KeyTrust::CheckEachFile);
    assert_eq!(cold, uncached(&original));
    assert_eq!((stats.key_mismatches, stats.misses > 0), (0, true));

    let want = uncached(&edited);
    assert_ne!(want, cold, "the edit changes the outputs");
    let (got, stats) = launch(&edited, &cache, KeyTrust::CheckEachFile);
    assert_eq!(
        got, want,
        "the edited file's own outputs, not the original's"
    );
    assert_eq!(stats.key_mismatches, 1);
    assert!(
        stats.packed > 0,
        "the edited weight is packed from its bytes"
    );
    // A file whose keys did not match is never recorded as checked: checked again each launch.
    let (again, stats) = launch(&edited, &cache, KeyTrust::CheckEachFile);
    assert_eq!((again, stats.key_mismatches, stats.packed), (want, 1, 0));

    // What trusting keys blindly gives (the finding): the original's outputs.
    let blind = scratch.join("blind.xbc");
    launch(&original, &blind, KeyTrust::TrustKeys);
    let (trusted, stats) = launch(&edited, &blind, KeyTrust::TrustKeys);
    assert_eq!((trusted, stats.packed), (cold, 0));
}

#[test]
fn an_unchanged_file_is_checked_once_then_trusted() {
    let scratch = scratch("checked-once");
    let ptd = scratch.join("model.ptd");
    std::fs::copy(dir().join("mlp_xnn_external.ptd"), &ptd).unwrap();
    let cache = scratch.join("w.xbc");
    let (cold, _) = launch(&ptd, &cache, KeyTrust::CheckEachFile);
    let saved = std::fs::read(&cache).unwrap();
    let (warm, stats) = launch(&ptd, &cache, KeyTrust::CheckEachFile);
    assert_eq!(
        (warm, stats.packed, stats.key_mismatches),
        (cold.clone(), 0, 0)
    );
    assert_eq!(
        stats.deferred_fills, 0,
        "a checked file's weights are not read on a warm launch"
    );
    assert_eq!(
        std::fs::read(&cache).unwrap(),
        saved,
        "a warm launch of a checked file writes nothing"
    );

    // Replaced by a copy (another inode and mtime): checked again, once, and the file is
    // rewritten with it; packed entries are still found.
    let copy = scratch.join("copy.ptd");
    std::fs::copy(&ptd, &copy).unwrap();
    std::fs::rename(&copy, &ptd).unwrap();
    let (warm, stats) = launch(&ptd, &cache, KeyTrust::CheckEachFile);
    assert_eq!((warm, stats.packed), (cold.clone(), 0));
    assert_ne!(
        std::fs::read(&cache).unwrap(),
        saved,
        "the new file recorded"
    );
    let recorded = std::fs::read(&cache).unwrap();
    let (_, stats) = launch(&ptd, &cache, KeyTrust::CheckEachFile);
    assert_eq!(stats.packed, 0);
    assert_eq!(std::fs::read(&cache).unwrap(), recorded);
}
