use super::*;

fn flat(ms: f64) -> Spread {
    Spread {
        median: ms,
        min: ms * 0.9,
        max: ms * 1.1,
    }
}

/// One model's results under both load modes, with `xnnblob_warm_ms` for xnnblob's warm.
fn results(xnnblob_warm_ms: f64) -> Vec<PeerResult> {
    let mut out = Vec::new();
    for mode in LOAD_MODES {
        for scenario in SCENARIOS {
            let ms = match (scenario.backend, scenario.cache) {
                ("xnnblob", CacheUse::Warm) => xnnblob_warm_ms,
                ("xnnblob", _) => 50.0,
                (_, CacheUse::Warm) => 10.0,
                _ => 200.0,
            };
            out.push(PeerResult {
                model: "m".into(),
                weights_mib: 96.0,
                exported: false,
                decode_steps: 1,
                load_mode: mode,
                scenario,
                measured: Measured {
                    load_to_ready_ms: flat(ms),
                    first_execute_ms: flat(20.0),
                    steady_execute_ms: flat(5.0),
                    first_output_ms: flat(ms + 20.0),
                    peak_rss_mib: flat(120.0),
                    load_anon_mib: flat(40.0),
                    load_file_mib: flat(70.0),
                    read_mib: flat(0.5),
                    disk_read_mib: flat(0.0),
                    cache_file_mib: 100.0,
                    floor_ms: (scenario.backend == "xnnblob" && scenario.cache == CacheUse::Warm)
                        .then(|| flat(0.8 * ms)),
                },
            });
        }
    }
    out
}

/// Where ExecuTorch's cache failed on a program, warm is compared with ExecuTorch without
/// a cache, and the failure is named.
#[test]
fn a_failed_executorch_cache_is_reported_and_warm_compared_without_it() {
    let results: Vec<PeerResult> = results(5.0)
        .into_iter()
        .filter(|r| r.scenario.backend == "xnnblob" || r.scenario.cache == CacheUse::Off)
        .collect();
    let failures: Vec<PeerFailure> = SCENARIOS
        .iter()
        .filter(|s| s.backend == "executorch" && s.cache != CacheUse::Off)
        .map(|&scenario| PeerFailure {
            model: "m".into(),
            load_mode: "mmap",
            scenario,
            reason: "signal: 11 (SIGSEGV); its last line: x".into(),
        })
        .collect();
    let md = markdown(&results, &failures, 5);
    assert!(
        md.contains(
            "m (mmap): warm load-to-ready / ExecuTorch without a cache (its cache failed): 0.025"
        ),
        "{md}"
    );
    assert!(
        md.contains("- m (mmap), executorch cache, warm: signal: 11 (SIGSEGV)"),
        "{md}"
    );
    let json: serde_json::Value = serde_json::from_str(&to_json(&results, &failures, 5)).unwrap();
    assert_eq!(json["failures"].as_array().unwrap().len(), failures.len());
}

#[test]
fn the_report_states_each_target_and_compare_reads_the_json() {
    let md = markdown(&results(1.0), &[], 5);
    // Warm 1 ms against ExecuTorch's 10: 0.1, met under mmap (0.5), not under file (0.01).
    assert!(
        md.contains("m (mmap): warm load-to-ready / ExecuTorch's warm: 0.100 (target <= 0.5): met"),
        "{md}"
    );
    assert!(
        md.contains(
            "m (file): warm load-to-ready / ExecuTorch's warm: 0.100 (target <= 0.01): NOT met"
        ),
        "{md}"
    );
    assert!(md.contains("cold / ExecuTorch's cold with its cache: 0.250 (target <= 0.4): met"));
    // The floor of the same launches: 0.8 ms under a warm load of 1.
    assert!(
        md.contains("m (mmap): warm load-to-ready / the floor (0.80 ms")
            && md.contains("): 1.250 (target <= 1.2): NOT met"),
        "{md}"
    );
    assert_eq!(md.matches("| m (96 MiB) |").count(), 2 * SCENARIOS.len());

    let dir = tempfile::tempdir().unwrap();
    let (base, new) = (dir.path().join("base.json"), dir.path().join("new.json"));
    std::fs::write(&base, to_json(&results(1.0), &[], 5)).unwrap();
    std::fs::write(&new, to_json(&results(1.5), &[], 5)).unwrap();
    let (report, regressed) = super::super::compare::compare(&base, &new, 20.0).unwrap();
    assert!(regressed, "{report}");
    assert!(report.contains("m | mmap | xnnblob, warm"), "{report}");
    let (_, regressed) = super::super::compare::compare(&base, &base, 0.0).unwrap();
    assert!(!regressed);

    let chart = dir.path().join("peer.svg");
    svg(&chart, &results(1.0)).unwrap();
    let text = std::fs::read_to_string(&chart).unwrap();
    assert!(text.starts_with("<svg") && text.contains("m (96 MiB), mmap"));
}

#[test]
fn an_exported_program_is_launched_with_each_steps_inputs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/executorch/export");
    let p = exported_program(&dir, "arch_mobilenet_v2_fp32").unwrap();
    assert!(p.exported && p.steps == 1);
    assert_eq!(p.args[1], "--data");
    assert!(p.args[2].ends_with("arch_mobilenet_v2_fp32.ptd"));
    assert!(p.args[4].ends_with("arch_mobilenet_v2_fp32.s{step}.in0.bin"));
    assert_eq!(&p.args[5..], ["--steps", "1"]);
    let mib = |p: &Path| std::fs::metadata(p).unwrap().len() as f64 / 1048576.0;
    assert_eq!(p.weights_mib, mib(&p.pte) + mib(p.ptd.as_ref().unwrap()));
    // A decoder whose weights stayed in the .pte: every token's inputs, no --data.
    let p = exported_program(&dir, "arch_llama_8da4w").unwrap();
    assert_eq!(p.steps, 4);
    assert!(!p.args.contains(&"--data".to_string()));
    assert!(p.args[2].ends_with("arch_llama_8da4w.s{step}.in0.bin"));
    assert!(p.args[4].ends_with("arch_llama_8da4w.s{step}.in1.bin"));
    assert_eq!(&p.args[5..], ["--steps", "4"]);
    let e = exported_program(&dir, "missing").err().unwrap();
    assert!(e.contains("export-executorch-fixtures.sh --bench"), "{e}");
}

#[test]
fn a_program_of_calls_runs_them_in_order_on_one_launch() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/executorch/export");
    let p = exported_program(&dir, "shared_prefill_step").unwrap();
    assert_eq!(p.steps, 4);
    assert_eq!(p.args[1], "--data");
    assert!(p.args[2].ends_with("shared_prefill_step.ptd"));
    let calls: Vec<&str> = p
        .args
        .iter()
        .skip_while(|a| *a != "--call")
        .step_by(2)
        .map(String::as_str)
        .collect();
    assert_eq!(calls, ["--call"; 4]);
    assert!(p.args[4].starts_with("prefill:") && p.args[4].ends_with("c0.in0.bin"));
    assert!(p.args[10].starts_with("step:") && p.args[10].ends_with("c3.in0.bin"));
}

#[test]
fn models_are_named_and_unknown_names_say_which_exist() {
    for name in MODEL_NAMES {
        assert!(!peer_models(name).unwrap().is_empty(), "{name}");
    }
    assert_eq!(
        peer_models("apps").unwrap().len(),
        APPS.len() + GENERATED_APPS.len()
    );
    for (_, stem) in APPS {
        let program = exported_program(&committed_exports_dir(), stem).unwrap();
        assert!(program.pte.is_file() && program.steps >= 1, "{stem}");
    }
    assert!(matches!(
        peer_model("qb4w").unwrap(),
        PeerModel::Generated(ModelSpec {
            dtype: Dtype::Qb4w,
            ..
        })
    ));
    assert_eq!(
        peer_model("llm-export").unwrap(),
        PeerModel::Exported("bench_llama_8da4w")
    );
    let e = peer_model("resnet").unwrap_err();
    assert!(e.contains("resnet") && e.contains("llm1184"), "{e}");
}
