//! SharedDataCache: one init per key under contention, shared failures, release with the last
//! handle, mapped files released in transformed mode, modes and alignment, panicking inits.

use crate::common;

use common::scratch as scratch_dir;

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::Duration;
use xnnblob::named_data::{
    DataBuffer, FileDataMap, InMemoryMap, NamedBlobStore, NamedDataError, NamedDataMap,
};
use xnnblob::shared_data::{SharedData, SharedDataCache, SharedDataError};

/// How long a liveness check waits before calling a hang a failure (never reached when the
/// code is right; not a timing assertion).
const LIVENESS: Duration = Duration::from_secs(60);

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Polls `condition` until it holds; panics (instead of hanging) if it never does.
fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let polls = LIVENESS.as_millis();
    for _ in 0..polls {
        if condition() {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    panic!("gave up waiting for {what}");
}

/// Runs `f` on its own thread and returns its result; panics (instead of hanging) if it
/// blocks forever.
fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

fn result_of<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(LIVENESS)
        .unwrap_or_else(|e| panic!("{what} never returned: {e}"))
}

fn is_mapped(path: &Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let path = path.to_str().unwrap();
    maps.lines().any(|line| line.contains(path))
}

fn in_memory(keys: &[(&str, Vec<u8>)]) -> InMemoryMap {
    let mut map = InMemoryMap::new("test");
    for (key, data) in keys {
        map.insert(key, data, 16, None).unwrap();
    }
    map
}

/// Whether `error` is the failed init of `key` whose cause reads `message`.
fn init_failed(error: &SharedDataError, key: &str, message: &str) -> bool {
    matches!(error, SharedDataError::InitFailed { key: k, cause }
        if k == key && xnnblob::report::report(cause.error()) == message)
}

#[test]
fn cache_and_handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SharedDataCache>();
    check::<SharedData>();
    check::<SharedDataError>();
}

#[test]
fn racing_callers_run_each_init_once_and_share_its_bytes() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 8;
    let keys = ["w0", "w1", "w2", "w3"];
    let data = [bytes(100, 1), bytes(1000, 2), bytes(37, 3), bytes(4096, 4)];
    let map = in_memory(&[
        (keys[0], data[0].clone()),
        (keys[1], data[1].clone()),
        (keys[2], data[2].clone()),
        (keys[3], data[3].clone()),
    ]);
    let cache = SharedDataCache::new();
    let init_runs: [AtomicUsize; 4] = Default::default();
    let barrier = Barrier::new(THREADS);

    let per_thread: Vec<Vec<(usize, SharedData)>> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cache, map, init_runs, barrier) = (&cache, &map, &init_runs, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut got = Vec::new();
                    for round in 0..ROUNDS {
                        for i in 0..keys.len() {
                            // Threads visit the keys in different orders.
                            let k = (i + t + round) % keys.len();
                            let handle = cache
                                .get_or_init(keys[k], || {
                                    init_runs[k].fetch_add(1, Ordering::SeqCst);
                                    // Widens the window in which other callers find it in flight.
                                    thread::sleep(Duration::from_millis(2));
                                    map.get_data(keys[k])
                                })
                                .unwrap();
                            // Handles are kept, so no entry is released during the race.
                            got.push((k, handle));
                        }
                    }
                    got
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });

    for (k, runs) in init_runs.iter().enumerate() {
        assert_eq!(runs.load(Ordering::SeqCst), 1, "init runs of {}", keys[k]);
    }
    let calls = THREADS * ROUNDS * keys.len();
    let stats = cache.stats();
    assert_eq!(stats.inits, 4);
    assert_eq!(stats.hits, calls - 4);
    assert_eq!(stats.failures, 0);
    assert_eq!(stats.entries, 4);
    assert_eq!(stats.bytes_held, data.iter().map(Vec::len).sum::<usize>());
    assert_eq!(cache.len(), 4);

    let mut first_ptr: [Option<*const u8>; 4] = [None; 4];
    for (k, handle) in per_thread.iter().flatten() {
        assert_eq!(handle.key(), keys[*k]);
        assert_eq!(&**handle, &data[*k][..]);
        // One shared buffer per key: every handle points at the same bytes.
        let ptr = handle.data().as_ptr();
        assert_eq!(*first_ptr[*k].get_or_insert(ptr), ptr, "key {}", keys[*k]);
    }
    drop(per_thread);
    assert!(cache.is_empty());
    assert_eq!(cache.stats().bytes_held, 0);
}

#[test]
fn a_failed_init_reaches_its_caller_and_every_waiter_and_is_not_cached() {
    const WAITERS: usize = 6;
    let cache = Arc::new(SharedDataCache::new());
    let waiter_init_runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();

    let initialiser = on_thread({
        let cache = cache.clone();
        move || {
            cache.get_or_init("k", move || {
                started_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                Err::<DataBuffer, _>("disk on fire")
            })
        }
    });
    result_of(&started_rx, "the init");
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (cache, runs) = (cache.clone(), waiter_init_runs.clone());
            on_thread(move || {
                cache.get_or_init("k", || {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<DataBuffer, _>("a waiter ran init")
                })
            })
        })
        .collect();
    // A caller is counted as a hit when it joins the init in flight: from then on it gets
    // that init's outcome.
    wait_until("the waiters to join the init", || {
        cache.stats().hits == WAITERS
    });
    release_tx.send(()).unwrap();

    let error = result_of(&initialiser, "the initialising caller").unwrap_err();
    assert!(init_failed(&error, "k", "disk on fire"), "{error:?}");
    assert!(error.to_string().contains("\"k\""), "{error}");
    for waiter in &waiters {
        assert_eq!(result_of(waiter, "a waiter").unwrap_err(), error);
    }
    assert_eq!(waiter_init_runs.load(Ordering::SeqCst), 0);
    assert!(!cache.contains("k"));
    let stats = cache.stats();
    assert_eq!((stats.inits, stats.failures, stats.entries), (0, 1, 0));

    // Not cached: the next call runs init again, and this one succeeds.
    let map = in_memory(&[("k", bytes(64, 9))]);
    let init_runs = AtomicUsize::new(0);
    let handle = cache
        .get_or_init("k", || {
            init_runs.fetch_add(1, Ordering::SeqCst);
            map.get_data("k")
        })
        .unwrap();
    assert_eq!(&*handle, &bytes(64, 9)[..]);
    assert_eq!(init_runs.load(Ordering::SeqCst), 1);
    assert_eq!(cache.stats().inits, 1);
    assert!(cache.contains("k"));
}

#[test]
fn an_entry_lives_exactly_as_long_as_its_handles() {
    let data = bytes(300, 5);
    let map = in_memory(&[("k", data.clone())]);
    let cache = SharedDataCache::new();
    let init_runs = AtomicUsize::new(0);
    let get = || {
        cache.get_or_init("k", || {
            init_runs.fetch_add(1, Ordering::SeqCst);
            map.get_data("k")
        })
    };

    let first = get().unwrap();
    let second = get().unwrap();
    assert_eq!(init_runs.load(Ordering::SeqCst), 1);
    let third = second.clone();
    drop(first);
    drop(second);
    assert!(cache.contains("k"));
    assert_eq!(cache.stats().entries, 1);
    assert_eq!(cache.stats().bytes_held, data.len());
    assert_eq!(&*third, &data[..]);

    drop(third);
    assert!(!cache.contains("k"));
    assert!(cache.is_empty());
    assert_eq!(cache.stats().entries, 0);
    assert_eq!(cache.stats().bytes_held, 0);

    let again = get().unwrap();
    assert_eq!(init_runs.load(Ordering::SeqCst), 2);
    assert_eq!(cache.stats().inits, 2);
    assert_eq!(&*again, &data[..]);

    // A handle outlives the cache.
    drop(cache);
    assert_eq!(&*again, &data[..]);
    assert_eq!(again.buffer().len(), data.len());
}

fn write_ptd(dir: &Path, data: &[u8]) -> PathBuf {
    let mut store = NamedBlobStore::new();
    store.add_named_blob("k", data, 64, "w", None).unwrap();
    let path = dir.join("w.ptd");
    store.write_ptd("w", &path).unwrap();
    path
}

#[test]
#[cfg(target_os = "linux")]
fn transformed_mode_releases_the_original_mapping() {
    let dir = scratch_dir("transformed");
    let data = bytes(10_000, 7);
    let path = write_ptd(&dir, &data);
    let map = FileDataMap::open_ptd(&path).unwrap();
    assert!(is_mapped(&path));

    let cache = SharedDataCache::new();
    let shared = cache
        .get_or_init_transformed(
            "k",
            || map.get_data("k"),
            |original| Ok(original.iter().map(|b| b.wrapping_add(1)).collect()),
            64,
        )
        .unwrap();
    drop(map);
    // Nothing holds the mapping any more: not the entry, not the cache.
    assert!(!is_mapped(&path), "{} is still mapped", path.display());
    let expected: Vec<u8> = data.iter().map(|b| b.wrapping_add(1)).collect();
    assert_eq!(&*shared, &expected[..]);
    assert_eq!(shared.data().as_ptr() as usize % 64, 0);
    assert_eq!(cache.stats().bytes_held, data.len());

    drop(shared);
    assert!(cache.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg(target_os = "linux")]
fn read_only_mode_keeps_the_mapping_while_a_handle_lives() {
    let dir = scratch_dir("read-only");
    let data = bytes(10_000, 8);
    let path = write_ptd(&dir, &data);
    let map = FileDataMap::open_ptd(&path).unwrap();

    let cache = SharedDataCache::new();
    let shared = cache.get_or_init("k", || map.get_data("k")).unwrap();
    drop(map);
    assert!(is_mapped(&path), "the handle should keep the file mapped");
    assert_eq!(&*shared, &data[..]);

    drop(shared);
    assert!(!is_mapped(&path), "{} is still mapped", path.display());
    assert!(cache.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn modes_do_not_mix_and_alignment_is_honoured() {
    let map = in_memory(&[("ro", bytes(100, 1)), ("tx", bytes(100, 2))]);
    let cache = SharedDataCache::new();
    let loads = AtomicUsize::new(0);
    let load = |key: &'static str| {
        let (map, loads) = (&map, &loads);
        move || {
            loads.fetch_add(1, Ordering::SeqCst);
            map.get_data(key)
        }
    };
    let copy = |b: &[u8]| Ok::<_, NamedDataError>(b.to_vec());

    let ro = cache.get_or_init("ro", load("ro")).unwrap();
    let err = cache
        .get_or_init_transformed("ro", load("ro"), copy, 64)
        .unwrap_err();
    assert_eq!(
        err,
        SharedDataError::ModeMismatch {
            key: "ro".to_string()
        }
    );

    let tx = cache
        .get_or_init_transformed("tx", load("tx"), copy, 64)
        .unwrap();
    assert_eq!(tx.data().as_ptr() as usize % 64, 0);
    let err = cache.get_or_init("tx", load("tx")).unwrap_err();
    assert!(matches!(&err, SharedDataError::ModeMismatch { key } if key == "tx"));
    assert!(err.to_string().contains("\"tx\""), "{err}");
    assert_eq!(loads.load(Ordering::SeqCst), 2);

    // A copy aligned to 64 serves 16, not 128.
    let smaller = cache
        .get_or_init_transformed("tx", load("tx"), copy, 16)
        .unwrap();
    assert_eq!(smaller.data().as_ptr(), tx.data().as_ptr());
    let err = cache
        .get_or_init_transformed("tx", load("tx"), copy, 128)
        .unwrap_err();
    assert_eq!(
        err,
        SharedDataError::BadAlignment {
            key: "tx".to_string(),
            alignment: 128
        }
    );

    for alignment in [0, 3, 48] {
        let err = cache
            .get_or_init_transformed("new", load("tx"), copy, alignment)
            .unwrap_err();
        assert_eq!(
            err,
            SharedDataError::BadAlignment {
                key: "new".to_string(),
                alignment
            }
        );
    }
    assert!(!cache.contains("new"));
    assert_eq!(loads.load(Ordering::SeqCst), 2);

    // Large alignments too, over several keys (so one lucky pointer cannot pass).
    let many: Vec<_> = (0..8)
        .map(|i| {
            cache
                .get_or_init_transformed(&format!("a{i}"), load("tx"), copy, 4096)
                .unwrap()
        })
        .collect();
    for handle in &many {
        assert_eq!(handle.data().as_ptr() as usize % 4096, 0);
        assert_eq!(&**handle, &bytes(100, 2)[..]);
    }
    let stats = cache.stats();
    assert_eq!((stats.inits, stats.hits, stats.failures), (10, 1, 0));
    drop((ro, tx, smaller, many));
    assert!(cache.is_empty());
}

#[test]
fn transformed_mode_failures_name_the_step_and_are_not_cached() {
    let map = in_memory(&[("k", bytes(10, 1))]);
    let cache = SharedDataCache::new();

    let err = cache
        .get_or_init_transformed(
            "missing",
            || map.get_data("missing"),
            |b| Ok(b.to_vec()),
            16,
        )
        .unwrap_err();
    assert!(
        matches!(&err, SharedDataError::InitFailed { key, cause }
            if key == "missing" && cause.to_string() == "load failed"
                && xnnblob::report::report(cause.error()).contains("not found")),
        "{err}"
    );

    let err = cache
        .get_or_init_transformed(
            "k",
            || map.get_data("k").map_err(|e| e.to_string()),
            |_| Err("bad dtype".to_string()),
            16,
        )
        .unwrap_err();
    assert!(
        init_failed(&err, "k", "transform failed: bad dtype"),
        "{err:?}"
    );
    // The transform's own error is the cause's source, not a string in its place.
    let source = std::error::Error::source(&err).and_then(std::error::Error::source);
    assert_eq!(source.map(|e| e.to_string()).as_deref(), Some("bad dtype"));
    assert!(!cache.contains("k"));
    assert_eq!(cache.stats().failures, 2);

    let ok = cache
        .get_or_init_transformed("k", || map.get_data("k"), |b| Ok(b.to_vec()), 16)
        .unwrap();
    assert_eq!(&*ok, &bytes(10, 1)[..]);
    assert_eq!(cache.stats().inits, 1);
}

#[test]
fn a_panicking_init_fails_its_waiters_and_does_not_block_later_callers() {
    let map = Arc::new(in_memory(&[("p", bytes(50, 3)), ("q", bytes(60, 4))]));
    let cache = Arc::new(SharedDataCache::new());

    // Alone: the panic reaches the caller, and nothing stays in flight.
    let caught = panic::catch_unwind(AssertUnwindSafe(|| {
        cache.get_or_init("p", || -> Result<DataBuffer, String> { panic!("boom") })
    }));
    assert!(caught.is_err());
    assert!(!cache.contains("p"));
    assert_eq!(cache.stats().failures, 1);
    let later = result_of(
        &on_thread({
            let (cache, map) = (cache.clone(), map.clone());
            move || {
                cache
                    .get_or_init("p", || map.get_data("p"))
                    .map(|h| h.to_vec())
            }
        }),
        "a caller after the panic",
    );
    assert_eq!(later.unwrap(), bytes(50, 3));

    // With a waiter: the waiter gets an error instead of blocking forever.
    let (started_tx, started_rx) = mpsc::channel();
    let panicker = on_thread({
        let cache = cache.clone();
        move || {
            panic::catch_unwind(AssertUnwindSafe(|| {
                cache.get_or_init("q", || -> Result<DataBuffer, String> {
                    let hits = cache.stats().hits;
                    started_tx.send(hits).unwrap();
                    wait_until("the waiter to join", || cache.stats().hits == hits + 1);
                    panic!("boom")
                })
            }))
            .is_err()
        }
    });
    let _hits_before = result_of(&started_rx, "the panicking init");
    let waiter = on_thread({
        let (cache, map) = (cache.clone(), map.clone());
        move || {
            cache
                .get_or_init("q", || map.get_data("q"))
                .map(|h| h.to_vec())
        }
    });
    assert_eq!(
        result_of(&waiter, "the waiter").unwrap_err(),
        SharedDataError::InitPanicked {
            key: "q".to_string()
        }
    );
    assert!(result_of(&panicker, "the panicking caller"));
    assert!(!cache.contains("q"));
    let q = cache.get_or_init("q", || map.get_data("q")).unwrap();
    assert_eq!(&*q, &bytes(60, 4)[..]);
    let stats = cache.stats();
    assert_eq!((stats.failures, stats.inits), (2, 2));
}

#[test]
fn an_init_that_asks_for_its_own_key_gets_an_error_not_a_deadlock() {
    let map = Arc::new(in_memory(&[("k", bytes(20, 6)), ("other", bytes(30, 7))]));
    let cache = Arc::new(SharedDataCache::new());
    let outcome = on_thread({
        let (cache, map) = (cache.clone(), map.clone());
        move || {
            let mut inner = Vec::new();
            let outer = cache.get_or_init("k", || {
                // Another key is fine; its own key in either mode is not.
                inner.push(
                    cache
                        .get_or_init("other", || map.get_data("other"))
                        .map(|_| ()),
                );
                inner.push(cache.get_or_init("k", || map.get_data("k")).map(|_| ()));
                inner.push(
                    cache
                        .get_or_init_transformed("k", || map.get_data("k"), |b| Ok(b.to_vec()), 16)
                        .map(|_| ()),
                );
                map.get_data("k")
            });
            (outer, inner)
        }
    });
    let (outer, inner) = result_of(&outcome, "the re-entrant init");
    let outer = outer.unwrap();
    assert_eq!(&*outer, &bytes(20, 6)[..]);
    assert_eq!(inner[0], Ok(()));
    assert!(
        matches!(&inner[1], Err(SharedDataError::InitRecursion { key }) if key == "k"),
        "{:?}",
        inner[1]
    );
    assert_eq!(
        inner[2],
        Err(SharedDataError::ModeMismatch {
            key: "k".to_string()
        })
    );
    assert!(cache.contains("k"));
}
