//! Threads: loads from several threads at once, and ExecuTorch's thread pool.

use super::*;

#[test]
fn eight_threads_loading_one_program_share_one_cache_file() {
    let dir = scratch("threads");
    let cache = dir.join("weights.xbc");
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        cache.display().to_string(),
        s("--threads"),
        s("8"),
    ]);
    // The runner fails if any thread's outputs differ from the first's.
    let run = run_ok(&args);
    let c = run.cache(&cache.display().to_string());
    // Each weight once: the entries and packed bytes of a single thread's file (the layout may
    // differ: a draft the threads' races left mostly holes is written anew, tightly).
    let contents = |path: &std::path::Path| {
        let options = xnnblob::cache::CacheOptions::default();
        let report = xnnblob::cache::verify_file(path, &options, true, false)
            .unwrap()
            .unwrap();
        assert!(report.corrupt.is_empty() && report.invalid_entries == 0);
        (report.entries, report.packed_bytes)
    };
    let single = {
        let one_dir = scratch("threads-one");
        let one = one_dir.join("weights.xbc");
        let mut a = mlp_args();
        a.extend([s("--cache"), one.display().to_string()]);
        run_ok(&a);
        contents(&one)
    };
    assert_eq!(contents(&cache), single, "one cache of 1x size");
    let file_len = std::fs::metadata(&cache).unwrap().len();
    assert!(
        file_len < single.1 + single.1 / 4 + 64 * 1024,
        "{file_len} bytes: no more than a quarter of holes"
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["weights.xbc", "weights.xbc.checked", "weights.xbc.lock"],
        "no stray temporary files (the record is the save's: what it wrote needs no check)"
    );
    assert_eq!(c["entries"], 3, "{}", run.stdout);
}

/// The CNN fixture's runner arguments, writing its outputs into `out` (made here).
fn cnn_args(out: &Path) -> Vec<String> {
    std::fs::create_dir_all(out).unwrap();
    let dir = data();
    vec![
        dir.join("cnn_xnn_external.pte").display().to_string(),
        s("--data"),
        dir.join("cnn_xnn_external.ptd").display().to_string(),
        s("--input"),
        dir.join("cnn.input.f32").display().to_string(),
        s("--repeat"),
        s("3"),
        s("--output-dir"),
        out.display().to_string(),
    ]
}

/// The runner's `pool executorch:` line: threads, operator calls run on ExecuTorch's pool, and
/// run on the caller for want of one.
fn pool_line(run: &Run) -> (u64, u64, u64) {
    let line = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("pool executorch: "))
        .unwrap_or_else(|| panic!("no pool line in:\n{}", run.stdout));
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |key: &str| -> u64 {
        let at = words.iter().position(|w| *w == key).unwrap();
        words[at + 1].parse().unwrap()
    };
    (
        value("threads"),
        value("operator_runs"),
        value("inline_runs"),
    )
}

#[test]
fn xnnblob_runs_on_executorchs_own_thread_pool_at_the_size_the_app_gives_it() {
    let dir = scratch("et-pool");
    let witness_dir = dir.join("executorch");
    let mut witness = cnn_args(&witness_dir);
    witness.extend([s("--backend"), s("executorch")]);
    run_ok(&witness);
    let expected = f32s(&std::fs::read(witness_dir.join("output0.f32")).unwrap());
    let machine = xnnblob::backend::machine_threads() as u64;

    let cases: [(&str, &[&str]); 4] = [
        ("default", &[]),
        ("three", &["--pool-threads", "3"]),
        ("one", &["--pool-threads", "1"]),
        ("guarded", &["--no-pool"]),
    ];
    for (name, extra) in cases {
        let out = dir.join(name);
        let mut args = cnn_args(&out);
        args.extend(extra.iter().map(|a| a.to_string()));
        let run = run_ok(&args);
        let got = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
        assert_eq!(got.len(), expected.len(), "{name}: output length");
        let diff = relative_difference(&got, &expected);
        assert!(
            diff <= 1e-5,
            "{name}: {diff} of the range from ExecuTorch's backend"
        );
        // No pool of xnnblob's own: every worker the process had was ExecuTorch's.
        assert_eq!(
            run.number("own_pool_threads"),
            0.0,
            "{name}:\n{}",
            run.stdout
        );
        let (threads, on_pool, inline) = pool_line(&run);
        match name {
            "default" => {
                assert_eq!(
                    threads, machine,
                    "ExecuTorch's default: one thread per core"
                );
                if machine > 1 {
                    assert!(
                        on_pool > 0,
                        "operators ran on ExecuTorch's pool:\n{}",
                        run.stdout
                    );
                }
            }
            "three" => {
                assert_eq!(threads, 3, "_unsafe_reset_threadpool(3) is honoured");
                assert!(
                    on_pool > 0,
                    "operators ran on ExecuTorch's pool:\n{}",
                    run.stdout
                );
            }
            "one" => {
                assert_eq!(threads, 1);
                assert_eq!(
                    on_pool, 0,
                    "a pool of one runs on the caller:\n{}",
                    run.stdout
                );
            }
            _ => {
                // Created under a NoThreadPoolGuard: the runtime has no pool, as ExecuTorch's.
                assert_eq!((on_pool, inline), (0, 0), "{}", run.stdout);
            }
        }
    }
}

/// A delegate of small operators only runs on the calling thread, not split across
/// ExecuTorch's pool (each operator the pool runs wakes its workers, which costs more than such
/// an operator: `src/delegate/threading.rs`), and gives ExecuTorch's outputs; a CNN's larger
/// operators still run on the pool (`xnnblob_runs_on_executorchs_own_thread_pool_...`).
#[test]
fn a_small_decoder_runs_on_the_calling_thread_and_matches_executorch() {
    let dir = data().join("export");
    let (mut args, expected) = io_program(&dir, "arch_llama_8da4w");
    let runner = Runner::host(ET_RUN, None);
    let worst = check_outputs(
        &runner,
        "arch_llama_8da4w",
        "xnnblob",
        &args,
        &expected,
        1e-3,
    );
    eprintln!("arch_llama_8da4w: {worst:e} of the range from ExecuTorch's outputs");
    args.extend([s("--backend"), s("xnnblob")]);
    let run = run_ok(&args);
    let (threads, on_pool, _) = pool_line(&run);
    if xnnblob::backend::machine_threads() > 1 {
        assert!(threads > 1, "{}", run.stdout);
    }
    assert_eq!(
        on_pool, 0,
        "no operator split across the pool:\n{}",
        run.stdout
    );
}

/// ExecuTorch's pool starts in the load, as ExecuTorch's backend starts it, so that a first
/// execute never starts it (a program's own kernels run on it too); under a `NoThreadPoolGuard`
/// neither backend starts it.
#[test]
fn the_pool_starts_in_the_load_as_with_executorchs_backend_and_not_under_a_guard() {
    let dir = scratch("pool-in-load");
    let export = data().join("export");
    let (args, _) = io_program(&export, "arch_llama_8da4w");
    // Its `--steps N` dropped: loads alone.
    let loads = |backend: &str, guarded: bool| -> Vec<String> {
        let cache = dir.join(format!("{backend}.cache"));
        let mut a: Vec<String> = args[..args.len() - 2].to_vec();
        a.extend([
            s("--steps"),
            s("0"),
            s("--load-mode"),
            s("mmap"),
            s("--backend"),
            s(backend),
            s("--cache"),
            cache.display().to_string(),
        ]);
        if guarded {
            a.push(s("--no-pool"));
        }
        a
    };
    let unnamed = |run: &Run| run.number("load_unnamed_threads") as u64;
    run_ok(&loads("xnnblob", false));
    // The fewest over three warm launches: a launch soon after the file was written may still
    // check it, on a thread of its own, and a busy machine stretches that check into the load.
    let fewest = |guarded: bool| {
        (0..3)
            .map(|_| run_ok(&loads("xnnblob", guarded)))
            .min_by_key(|r| unnamed(r))
            .expect("three launches")
    };
    let guarded = fewest(true);
    assert_eq!(unnamed(&guarded), 0, "{}", guarded.stdout);
    if xnnblob::backend::machine_threads() > 1 {
        let started = fewest(false);
        let et = run_ok(&loads("executorch", false));
        assert!(unnamed(&et) > 0, "{}", et.stdout);
        assert_eq!(unnamed(&started), unnamed(&et), "{}", started.stdout);
    }
}
