//! What a launch reads, maps and copies, and where its init's time goes.

use super::*;

/// Issue 61: the runner's breakdown of the delegates' inits adds up, so the peer bench's floor
/// (the load less the inits, plus the thread pool and XNNPACK's runtime creation) is made of
/// parts of the same launch.
#[test]
fn the_init_breakdown_adds_up() {
    let dir = scratch("init-breakdown");
    let mut args = mlp_args();
    args.extend([s("--cache"), dir.join("weights.xbc").display().to_string()]);
    for launch in ["cold", "warm"] {
        let run = run_ok(&args);
        let n = |key: &str| run.number(key);
        assert_eq!(n("init_delegates"), 1.0, "{launch}: {}", run.stdout);
        let parts = n("init_weights_ms")
            + n("init_pool_ms")
            + n("init_load_ms")
            + n("init_prepack_ms")
            + n("init_create_ms")
            + n("init_finalize_ms");
        assert!(
            parts <= n("init_ms") + 0.01 && n("init_ms") <= n("load_to_ready_ms") + 0.01,
            "{launch}: {}",
            run.stdout
        );
        assert!(
            n("init_xnnpack_runtime_ms") > 0.0
                && n("init_xnnpack_runtime_ms") <= n("init_create_ms"),
            "{launch}: {}",
            run.stdout
        );
    }
}

#[test]
fn a_warm_launch_with_the_file_loader_reads_no_weights_and_the_cache_does_not_grow() {
    let dir = scratch("warm");
    let cache = dir.join("weights.xbc");
    let launch = |out: &str| {
        let mut args = mlp_args();
        args.extend([
            s("--load-mode"),
            s("file"),
            s("--cache"),
            cache.display().to_string(),
            s("--output-dir"),
            dir.join(out).display().to_string(),
        ]);
        std::fs::create_dir_all(dir.join(out)).unwrap();
        run_ok(&args)
    };
    let weights = std::fs::metadata(data().join("mlp_qd8_qc8w_external.ptd"))
        .unwrap()
        .len() as f64;
    let cold = launch("cold");
    let c = cold.cache(&cache.display().to_string());
    // Into a cache file that held nothing, a program this small is packed by its runtimes'
    // creation, as ExecuTorch's backend packs it, from the constants as the loader gives them:
    // no placeholder is read in.
    assert!(
        c["packed"] > 0 && c["misses"] == c["packed"] && c["deferred_fills"] == 0,
        "{}",
        cold.stdout
    );
    // No weight is copied twice: the cold launch copies at most the weight file once.
    assert!(
        cold.number("named_data_copied_bytes") <= weights,
        "{}",
        cold.stdout
    );
    let size = std::fs::metadata(&cache).unwrap().len();
    let mut first_warm = None;
    for i in 0..20 {
        let warm = launch(&format!("warm{i}"));
        let w = warm.cache(&cache.display().to_string());
        assert_eq!(w["packed"], 0, "warm launch {i} packs nothing");
        assert_eq!(w["deferred_fills"], 0, "no placeholder was read in");
        // No weight is read; a constant XNNPACK reads as it is would get a padded copy if its
        // buffer ended on a page boundary.
        assert!(
            warm.number("named_data_copied_bytes") < 0.02 * weights,
            "warm launch {i} copies: {}",
            warm.stdout
        );
        assert_eq!(std::fs::metadata(&cache).unwrap().len(), size, "no growth");
        first_warm.get_or_insert(warm.number("load_rchar"));
        assert_eq!(
            std::fs::read(dir.join(format!("warm{i}/output0.f32"))).unwrap(),
            std::fs::read(dir.join("cold/output0.f32")).unwrap(),
            "warm outputs are the cold ones"
        );
    }
    let warm_read = first_warm.unwrap();
    assert!(warm_read < 1024.0 * 1024.0);
    assert!(
        cold.number("load_rchar") - warm_read > 0.9 * weights,
        "the cold launch read the weights ({} B), the warm one did not ({warm_read} B)",
        cold.number("load_rchar")
    );
}

#[test]
fn no_launch_under_the_mmap_loader_copies_named_data() {
    // The mmap loader's buffers are pages of the file: every constant has room for XNNPACK's
    // over-read, so nothing is copied, cold or warm, and the outputs are ExecuTorch's.
    let dir = scratch("mmap-copies");
    let cache = dir.join("weights.xbc");
    for launch in ["cold", "warm"] {
        let mut args = mlp_args();
        args.extend([
            s("--load-mode"),
            s("mmap"),
            s("--cache"),
            cache.display().to_string(),
        ]);
        let run = run_ok(&args);
        assert_eq!(
            run.number("named_data_copied_bytes"),
            0.0,
            "{launch}: {}",
            run.stdout
        );
    }
}

/// A cold launch packs a blockwise model's weights ahead of its runtimes' creation from the mmap
/// loader's own pages, their bf16 scales included: no placeholder is read in (each read-in is a
/// copy and four changes of a mapping), and a warm launch then finds every packing.
#[test]
fn a_cold_launch_packs_blockwise_weights_and_their_scales_from_the_loaders_pages() {
    let dir = scratch("blockwise-cold");
    let cache = dir.join("weights.xbc");
    let (mut args, _) = io_program(&data().join("export"), "arch_llama_8da4w");
    args.extend([
        s("--load-mode"),
        s("mmap"),
        s("--cache"),
        cache.display().to_string(),
    ]);
    let path = cache.display().to_string();
    // The cache file holds another program's weights first: into one that held nothing, a
    // program this small is packed by its runtimes' creation instead.
    let (mut other, _) = io_program(&data().join("export"), "arch_unet_fp32");
    other.extend([s("--load-mode"), s("mmap"), s("--cache"), path.clone()]);
    run_ok(&other);
    let cold = run_ok(&args);
    let c = cold.cache(&path);
    assert!(c["packed"] > 0, "{}", cold.stdout);
    if xnnblob::backend::machine_threads() > 1 {
        // With one thread, no packing ahead: the runtimes' creation packs from placeholders.
        assert!(
            c["hits"] >= c["packed"],
            "packed ahead, then found by the creation:\n{}",
            cold.stdout
        );
        assert_eq!(
            c["deferred_fills"], 0,
            "no placeholder read in:\n{}",
            cold.stdout
        );
    }
    let warm = run_ok(&args);
    let w = warm.cache(&path);
    assert_eq!(
        (w["packed"], w["deferred_fills"]),
        (0, 0),
        "{}",
        warm.stdout
    );
}

/// Issue 61: in a warm launch, a delegate whose payload is only its graph keeps it until it is
/// destroyed, so a launch of a program of many delegates releases none of them during its load
/// (each release, under the mmap loader, an unmapping that flushes the TLB of the core
/// ExecuTorch's pool spins on); a cold launch, whose peak is its packing, releases them as
/// ExecuTorch's backend does once it has packed. Both compute as before.
#[test]
fn delegates_keep_their_small_payloads_through_the_load() {
    let dir = scratch("payloads-kept");
    let runner = Runner::host(ET_RUN, None);
    let (mut args, expected) = io_program(&data().join("export"), "arch_vit_fp32");
    args.extend([
        s("--load-mode"),
        s("mmap"),
        s("--cache"),
        dir.join("weights.xbc").display().to_string(),
    ]);
    for launch in ["cold", "warm"] {
        let m = measure(&runner, launch, "xnnblob", &args, &expected)
            .unwrap_or_else(|e| panic!("{launch}: {e}"));
        assert!(m.worst <= 1e-5, "{launch}: {} off at {}", m.worst, m.at);
        let delegates = m.run.number("init_delegates");
        assert!(delegates > 1.0, "{launch}: {}", m.run.stdout);
        let kept = m.run.number("init_payloads_kept");
        if launch == "warm" {
            assert_eq!(kept, delegates, "every payload kept:\n{}", m.run.stdout);
        } else {
            assert!(kept < delegates, "packed, then released:\n{}", m.run.stdout);
        }
    }
}

/// Issue 61: a program none of whose delegates packs a weight (elementwise operations) neither
/// opens nor makes the cache file its options name: it has nothing to keep there, and opening
/// the file was a sixth of its load. In a process that loads it before a program that packs,
/// the first delegate that packs opens the file, as before. Outputs are ExecuTorch's each time.
#[test]
fn a_program_that_packs_no_weight_opens_no_cache_file() {
    let dir = scratch("packs-nothing");
    let runner = Runner::host(ET_RUN, None);
    let export = data().join("export");
    let cache = dir.join("weights.xbc");
    let path = cache.display().to_string();
    let with_cache = |mut args: Vec<String>| {
        args.extend([s("--load-mode"), s("mmap"), s("--cache"), path.clone()]);
        args
    };
    let (elementwise, expected) = io_program(&export, "op_binary_fp32");
    for launch in ["first", "second"] {
        let m = measure(
            &runner,
            launch,
            "xnnblob",
            &with_cache(elementwise.clone()),
            &expected,
        )
        .unwrap_or_else(|e| panic!("{launch}: {e}"));
        assert!(m.worst <= 1e-5, "{launch}: {} off at {}", m.worst, m.at);
        assert!(!cache.exists(), "{launch}: no file made:\n{}", m.run.stdout);
        assert!(
            !m.run.stdout.contains(&format!("cache {path}:")),
            "{launch}: no cache opened:\n{}",
            m.run.stdout
        );
    }
    // Each program's arguments without their `--steps N`, one step of each.
    let (unet, _) = io_program(&export, "arch_unet_fp32");
    let mut both = elementwise[..elementwise.len() - 2].to_vec();
    both.extend_from_slice(&unet[..unet.len() - 2]);
    both.extend([s("--steps"), s("1"), s("--backend"), s("xnnblob")]);
    let run = run_ok(&with_cache(both));
    assert!(run.cache(&path)["packed"] > 0, "{}", run.stdout);
    assert!(cache.exists(), "the program that packs made the file");
}

/// The fraction of `path`'s pages in the page cache (`mincore` over a map of it).
fn resident_fraction(path: &Path) -> f64 {
    let map = xnnblob::mmap::MappedFile::open(path).unwrap();
    let pages = map.bytes().len().div_ceil(4096);
    let resident = (0..pages)
        .filter(|p| {
            let mut v = 0u8;
            // SAFETY: a page-aligned page inside the live map; mincore writes one byte.
            unsafe {
                libc::mincore(
                    map.as_ptr().add(p * 4096) as *mut libc::c_void,
                    4096,
                    &mut v,
                )
            };
            v & 1 == 1
        })
        .count();
    resident as f64 / pages as f64
}

fn drop_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a valid descriptor; the advice changes no data.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[test]
fn a_warm_launch_with_the_mmap_loader_leaves_the_weights_on_disk() {
    // Depthwise filters are packed at every launch (XNNPACK keeps no cache entry for them), so
    // a warm launch reads those few KiB: it must not fault in the device's readahead window
    // around each (8 MiB on some disks), which read a CNN's whole weight file before.
    let dir = scratch("mmap-warm-disk");
    let spec = xnnblob_test_support::synthetic::model::ModelSpec::cnn(48);
    let mut args = bench_model(spec, &dir);
    let ptd = PathBuf::from(&args[2]);
    args.extend([
        s("--backend"),
        s("xnnblob"),
        s("--load-mode"),
        s("mmap"),
        s("--cache"),
        dir.join("cnn.cache").display().to_string(),
        s("--steps"),
        s("0"),
    ]);
    run_ok(&args);
    std::fs::File::open(&ptd).unwrap().sync_all().unwrap();
    drop_from_page_cache(&ptd);
    if resident_fraction(&ptd) > 0.01 {
        xnnblob_test_support::cannot_run(&format!(
            "{} stays in the page cache after POSIX_FADV_DONTNEED (tmpfs?)",
            ptd.display()
        ));
        return;
    }
    let warm = run_ok(&args);
    assert_eq!(
        warm.cache(&dir.join("cnn.cache").display().to_string())["packed"],
        0
    );
    // ExecuTorch's loader reads the file's header itself (and a window around it).
    let resident = resident_fraction(&ptd);
    assert!(
        resident < 0.3,
        "{:.0}% of the weight file was read by a warm launch",
        resident * 100.0
    );
}

/// A warm launch reads no constant through ExecuTorch's data map (a mapping of its own per
/// constant under the mmap loader): the packed weights are found in the cache, and the constants
/// XNNPACK reads at every launch (a static int8 network's biases and per-channel scales) are
/// kept in the cache file by the first launch. The outputs stay ExecuTorch's, cold and warm.
///
/// The first launch lends the cache ExecuTorch's own buffers of those constants, and the cache's
/// background save copies them while the program is alive: the file that save publishes, before
/// the launch ends (when the delegates would copy them instead), keeps every one of them.
#[test]
fn a_warm_launch_reads_no_constant_through_executorchs_data_map() {
    use std::io::Write;
    let dir = scratch("kept-constants");
    let runner = Runner::host(ET_RUN, None);
    let (mut args, expected) = io_program(&data().join("export"), "arch_mobilenet_v2_int8");
    args.extend([s("--load-mode"), s("mmap"), s("--cache")]);
    let with_cache = |name: &str| {
        let mut a = args.clone();
        a.push(dir.join(name).display().to_string());
        a
    };
    // Outputs, cold then warm, with one file; the report of each, with another.
    for label in ["cold", "warm"] {
        check_outputs(
            &runner,
            label,
            "xnnblob",
            &with_cache("checked.xbc"),
            &expected,
            1e-3,
        );
    }
    let path = dir.join("weights.xbc").display().to_string();
    let mut launch_args = with_cache("weights.xbc");
    launch_args.extend([s("--backend"), s("xnnblob")]);
    // The first launch waits after its first execute, its program loaded, until told to go on:
    // the save runs meanwhile, once packing and inference pause.
    let (mut child, mut stderr, said) = launch_waiting(
        &[&launch_args[..], &[s("--repeat"), s("2")]].concat(),
        "the first launch",
    );
    let kept = || {
        xnnblob::cache::verify_file(Path::new(&path), &Default::default(), false, false)
            .ok()
            .and_then(Result::ok)
            .map_or(0, |report| report.kept_constants as u64)
    };
    let since = std::time::Instant::now();
    while kept() == 0 && since.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let saved_alive = kept();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin).unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let cold_stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}{rest}");
    let map_reads = cold_stdout
        .lines()
        .find_map(|l| l.strip_prefix("executorch_map_reads="))
        .and_then(|n| n.parse::<f64>().ok());
    assert!(
        saved_alive > 0 && map_reads > Some(0.0),
        "the first launch reads the constants, and a save while it is alive keeps them:\n\
         {cold_stdout}{said}{rest}"
    );
    let warm = run_ok(&launch_args);
    let w = warm.cache(&path);
    assert_eq!(
        w["kept_constants"], saved_alive,
        "every kept constant was in the file saved while the first launch was alive \
         (beside the delegate's identities, kept without lending):\n{}",
        warm.stdout
    );
    assert_eq!(w["packed"], 0, "{}", warm.stdout);
    assert_eq!(
        warm.number("executorch_map_reads"),
        0.0,
        "a warm launch reads nothing through ExecuTorch's map:\n{}",
        warm.stdout
    );
    assert_eq!(w["kept_served"], w["kept_constants"], "{}", warm.stdout);
}
