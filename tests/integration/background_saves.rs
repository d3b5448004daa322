//! Background saves coalesce: every `finalize` while a save runs makes that save go once more,
//! instead of queueing a save of the whole file per delegate (a 62-delegate ExecuTorch decoder
//! wrote its file 85 times, 4.9 s and 1.8 GB of peak RSS for a 106 MB cache). Nothing finalized
//! may be left unsaved: here 4 threads load 12 programs at once into one cache file, and the
//! next launch packs nothing.

use crate::common;

use common::scratch;
use xnnblob::backend::{Backend, WeightsCacheChoice};
use xnnblob::program::Program;
use xnnblob_test_support::synthetic::model::{self, Dtype, ModelSpec, Preset};

#[test]
fn finalizes_during_a_save_are_saved_by_it_and_nothing_is_lost() {
    let dir = scratch("background-saves");
    let specs: Vec<ModelSpec> = (1..=12)
        .map(|layers| ModelSpec {
            preset: Preset::LlmLike,
            dtype: if layers % 2 == 0 {
                Dtype::Fp32
            } else {
                Dtype::Qd8
            },
            mib: 1,
            layers,
        })
        .collect();
    let files: Vec<_> = specs
        .iter()
        .map(|s| model::ensure(s, &dir.join("models")).unwrap())
        .collect();
    let cache = dir.join("w.xbc");
    let launch = |backend: &Backend, i: usize| {
        let p = Program::load(
            backend,
            &files[i].pte,
            &[&files[i].ptd],
            Some(&WeightsCacheChoice::File(cache.clone())),
        )
        .unwrap();
        let out = p
            .method("forward")
            .unwrap()
            .execute_f32(&[&specs[i].input()])
            .unwrap();
        (out, p.weights_cache().unwrap().clone())
    };

    // Background saves (the default), finalized by each method's init, from 4 threads at once.
    let backend = Backend::with_defaults().unwrap();
    let cold: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (backend, launch) = (&backend, &launch);
                s.spawn(move || {
                    (t..12)
                        .step_by(4)
                        .map(|i| (i, launch(backend, i).0))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Vec<Vec<f32>>)> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, o)| o).collect()
    });
    let shared = backend.file_cache(&cache).unwrap();
    shared.wait_saved().unwrap();
    // Before any close: a dropped cache saves what is left, which would hide a lost save.
    assert_eq!(
        shared.stats().unsaved,
        0,
        "every finalized packing is on disk"
    );
    let saves = shared.saves();
    assert!((1..=12).contains(&saves), "{saves} saves for 12 finalizes");
    eprintln!("12 programs finalized from 4 threads: {saves} saves");
    drop(shared);
    drop(backend);

    let backend = Backend::with_defaults().unwrap();
    for (i, expected) in cold.iter().enumerate() {
        let (out, weights) = launch(&backend, i);
        assert_eq!(&out, expected, "program {i}");
        assert_eq!(
            weights.stats().packed,
            0,
            "program {i}: every packing was saved"
        );
    }

    // A save handed to a thread that waits for its next task (as the one that made the saves
    // above does) is found by that thread, though nobody waits for it and nothing wakes it.
    let later = dir.join("later.xbc");
    let p = Program::load(
        &backend,
        &files[0].pte,
        &[&files[0].ptd],
        Some(&WeightsCacheChoice::File(later.clone())),
    )
    .unwrap();
    let out = p
        .method("forward")
        .unwrap()
        .execute_f32(&[&specs[0].input()])
        .unwrap();
    assert_eq!(out, cold[0]);
    let weights = p.weights_cache().unwrap().clone();
    // Looked at until it has saved, or 6,000 looks (a minute's sleeps) have found nothing.
    for _ in 0..6000 {
        if weights.saves() > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        weights.saves(),
        1,
        "the save ran with no one waiting for it"
    );
    assert_eq!(weights.stats().unsaved, 0);
}
