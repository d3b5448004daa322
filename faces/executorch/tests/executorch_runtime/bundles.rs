//! Read-only layers packed ahead of time (`xnnblob prepack`) inside ExecuTorch's runtime.

use super::*;

/// Issue 40: a bundle packed ahead of time (`xnnblob::program::pack_ahead`, what `xnnblob
/// prepack` runs for this CPU's class), given as `packed_cache_layers`, makes the first launch
/// inside ExecuTorch's runtime warm: every exported program, the 8da4w decoder among them (whose
/// embedding and sampling only ExecuTorch runs), misses no weight, keeps nothing beyond the
/// bundle, and matches ExecuTorch's outputs. The bundle is never written.
#[test]
fn a_bundle_packed_ahead_makes_the_first_launch_inside_executorch_warm() {
    let dir = scratch("bundle-first-launch");
    let runner = Runner::host(ET_RUN, None);
    for p in exported_programs() {
        let program = PathBuf::from(&p.args[0]);
        let data: Vec<PathBuf> = p
            .args
            .windows(2)
            .filter(|w| w[0] == "--data")
            .map(|w| PathBuf::from(&w[1]))
            .collect();
        let bundle = dir.join(&p.label);
        let file = bundle.join(format!("{}.host.xbc", p.label));
        let packed = xnnblob::program::pack_ahead(&program, &data, &file)
            .unwrap_or_else(|e| panic!("{}: {e}", p.label));
        if packed.entries == 0 {
            // Nothing to pack (an argmax): no file, nothing to serve.
            assert!(!file.exists(), "{}", p.label);
            continue;
        }
        let before = std::fs::read(&file).unwrap();

        let writable = dir.join(format!("{}.writable.xbc", p.label));
        let mut args = p.args.clone();
        args.extend([
            s("--cache"),
            writable.display().to_string(),
            s("--cache-layers"),
            bundle.display().to_string(),
        ]);
        let m = measure(&runner, &p.label, "xnnblob", &args, &p.expected)
            .unwrap_or_else(|e| panic!("{}: {e}", p.label));
        assert!(m.worst <= p.tolerance, "{} {}: {}", p.label, m.at, m.worst);
        // Every look-up found its weight in the bundle, and nothing beyond it was kept. (A
        // transposed convolution is packed again at every launch, warm ones too, and then found:
        // XNNPACK 4ea82e5 packs deconvolutions before it looks them up.)
        let cache = m.run.cache(&writable.display().to_string());
        assert_eq!(cache["misses"], 0, "{}: {}", p.label, m.run.stdout);
        assert_eq!(
            cache["entries"] as usize, packed.entries,
            "{}: {}",
            p.label, m.run.stdout
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            before,
            "{}: the bundle",
            p.label
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A value of `packed_cache_layers` longer than ExecuTorch's option values (255 bytes and a NUL)
/// is the runner's error, never cut short; and layers without `packed_cache_path` are the
/// backend's error.
#[test]
fn layers_that_do_not_fit_an_option_or_lack_a_writable_cache_are_refused() {
    let long = format!("/{}", "x".repeat(300));
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        s("/tmp/unused.xbc"),
        s("--cache-layers"),
        long,
    ]);
    let err = runner(&args).unwrap_err();
    assert!(
        err.contains("longer than an ExecuTorch option value"),
        "{err}"
    );

    let mut args = mlp_args();
    args.extend([s("--cache-layers"), s("/tmp")]);
    let err = runner(&args).unwrap_err();
    assert!(
        err.contains("packed_cache_layers needs packed_cache_path"),
        "{err}"
    );
}

/// A bundle made for another CPU class (here: packed as if on a CPU with one more feature) is
/// ignored by the drop-in with one note in ExecuTorch's log, naming the directory, and the
/// writable cache takes over: the first launch packs every weight into it, the next finds them
/// there, and both match ExecuTorch's output.
#[test]
fn a_bundle_for_another_cpu_class_is_said_once_and_the_writable_cache_takes_over() {
    use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
    let dir = scratch("bundle-other-class");
    let bundle = dir.join("bundle");
    let data = data();
    let pte = data.join("mlp_qd8_qc8w_external.pte");
    let ptd = data.join("mlp_qd8_qc8w_external.ptd");
    {
        let other = xnnblob::cache::cpu_fingerprint() ^ 1;
        assert_ne!(
            xnnblob::cache::packing_class(other),
            xnnblob::cache::packing_class(xnnblob::cache::cpu_fingerprint())
        );
        let backend = Backend::new(BackendOptions {
            cache_options: xnnblob::cache::CacheOptions {
                cpu_fingerprint: Some(other),
                blocking_save: true,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        let file = bundle.join("mlp.other-class.xbc");
        std::fs::create_dir_all(&bundle).unwrap();
        let program = xnnblob::program::Program::load(
            &backend,
            &pte,
            std::slice::from_ref(&ptd),
            Some(&WeightsCacheChoice::File(file.clone())),
        )
        .unwrap();
        let _delegates = program.init_delegates("forward").unwrap();
        let cache = program.weights_cache().unwrap();
        cache.finalize().unwrap();
        cache.wait_saved().unwrap();
        assert!(file.is_file());
    }
    let writable = dir.join("writable.xbc");
    let mut args = mlp_args();
    args.extend([
        s("--cache"),
        writable.display().to_string(),
        s("--cache-layers"),
        bundle.display().to_string(),
    ]);
    let expected = f32s(&std::fs::read(data.join("mlp_qd8_qc8w_external.output_et.f32")).unwrap());
    for launch in 0..2 {
        let out = dir.join(format!("out{launch}"));
        std::fs::create_dir_all(&out).unwrap();
        let mut with_output = args.clone();
        with_output.extend([s("--output-dir"), out.display().to_string()]);
        let (ok, stdout, stderr) = run_any(&with_output);
        assert!(ok, "{stdout}{stderr}");
        let said = stderr.matches("is for this CPU's class").count();
        assert_eq!(said, 1, "launch {launch}: {stderr}");
        assert!(stderr.contains(&bundle.display().to_string()), "{stderr}");
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("cache {}:", writable.display())))
            .unwrap_or_else(|| panic!("{stdout}"));
        let packed_none = line.contains(" packed 0 ");
        assert_eq!(packed_none, launch == 1, "launch {launch}: {line}");
        let got = f32s(&std::fs::read(out.join("output0.f32")).unwrap());
        let d = relative_difference(&got, &expected);
        assert!(d <= 1e-3, "launch {launch}: {d}");
    }
}
