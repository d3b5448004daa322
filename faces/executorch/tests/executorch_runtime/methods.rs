//! Stateful programs: methods that share mutable buffers, repeated calls, a prefill and a decode.

use super::*;

/// Issue 43: ExecuTorch 1.5.1 exports whose methods share mutable buffers
/// (`MemoryPlanningPass(share_mutable_buffers=True)`, `scripts/export-executorch-fixtures.py`):
/// - `shared_prefill_step`: `prefill(x)` writes `cache`; `step(y)` reads it and counts its calls;
/// - `shared_prefill_decode`: a KV-cache decoder whose prefill (4 tokens) and decode (1 token)
///   are methods of their own, sharing every layer's caches;
/// - `shared_encoder_decoder`: `encode` computes a cross-attention cache that `decode` attends to,
///   keeping a running position;
/// - `shared_matmul_operand`: `step` multiplies by a matrix `prefill` wrote, written back as it is
///   read (the recipe that keeps ExecuTorch's partitioner from freezing it: see the script).
///
/// Called in sequence on one loaded program (`--call`), which shares ExecuTorch's arenas between
/// the methods, each call's output is eager PyTorch's (recorded by the export script), through
/// xnnblob's backend cold and warm with a cache file and through ExecuTorch's own. With the arenas
/// not shared (ExecuTorch's default), a method reads state the other never wrote: both backends
/// then differ from eager, which is why the runner shares them.
#[test]
fn methods_sharing_mutable_buffers_match_eager_when_their_arenas_are_shared() {
    let dir = data().join("export");
    let names = sharing_programs();
    assert_eq!(
        names,
        [
            "shared_encoder_decoder",
            "shared_matmul_operand",
            "shared_prefill_decode",
            "shared_prefill_step"
        ]
    );
    for name in &names {
        sharing_program_matches_eager(&Runner::host(ET_RUN, None), &dir, name);
    }
}

/// Issue 43: the runner's `--times N` repeats the `--call` before it, and `{step}` in its input
/// paths becomes the iteration (0 to N-1). `prefill` once, then `step` (or `decode`, with its
/// token and position) three times, each on its own inputs (NAME.calls.json's, copied to
/// `in{I}.{step}.bin`), gives eager PyTorch's outputs call by call on one Module sharing its
/// arenas: through xnnblob's backend cold and warm with a cache file (warm packs nothing), and
/// through ExecuTorch's own.
#[test]
fn times_repeats_a_call_reading_each_iterations_inputs_through_step() {
    let dir = data().join("export");
    let out = scratch("runner-times");
    for name in ["shared_prefill_step", "shared_prefill_decode"] {
        let description: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.calls.json"))).unwrap())
                .unwrap();
        let calls = description["calls"].as_array().unwrap();
        let repeated = io_steps::repeated_call(&dir, &description, &out.join(name));
        let method = repeated.method.as_str();
        let mut args = vec![dir.join(format!("{name}.pte")).display().to_string()];
        for data in description["data"].as_array().unwrap() {
            args.extend([
                s("--data"),
                dir.join(data.as_str().unwrap()).display().to_string(),
            ]);
        }
        args.extend([s("--call"), call_arg(&dir, repeated.first), s("--call")]);
        args.push(repeated.call_arg.clone());
        args.extend([s("--times"), repeated.times.to_string()]);
        let cache = out.join(format!("{name}.xbc")).display().to_string();
        for (tag, backend, extra) in [
            ("xnnblob-cold", "xnnblob", vec![s("--cache"), cache.clone()]),
            ("xnnblob-warm", "xnnblob", vec![s("--cache"), cache.clone()]),
            ("executorch", "executorch", vec![]),
        ] {
            let outputs = out.join(format!("{name}-{tag}"));
            std::fs::create_dir_all(&outputs).unwrap();
            let mut a = args.clone();
            a.extend([s("--backend"), s(backend), s("--output-dir")]);
            a.push(outputs.display().to_string());
            a.extend(extra);
            let run = run_ok(&a);
            assert_eq!(run.number("share_memory_arenas"), 1.0, "{name} {tag}");
            for step in 0..repeated.times {
                let line = format!(
                    "call step={} method={method} iteration={step} ms=",
                    step + 1
                );
                assert!(
                    run.stdout.contains(&line),
                    "{name} {tag}: {line} in {}",
                    run.stdout
                );
            }
            for (k, c) in calls.iter().enumerate() {
                let eager = f32s(
                    &std::fs::read(dir.join(c["outputs_eager"][0]["file"].as_str().unwrap()))
                        .unwrap(),
                );
                let ours =
                    f32s(&std::fs::read(outputs.join(format!("step{k}.output0.f32"))).unwrap());
                let worst = relative_difference(&ours, &eager);
                assert!(
                    worst < 1e-5,
                    "{name} {tag} call {k}: {worst:e} of eager's range"
                );
            }
            assert!(
                !outputs
                    .join(format!("step{}.output0.f32", calls.len()))
                    .exists(),
                "{name} {tag}: one output per call"
            );
            if tag == "xnnblob-warm" {
                assert_eq!(
                    run.cache(&cache)["packed"],
                    0,
                    "{name} warm: nothing packed"
                );
            }
        }
    }
}

/// A KV-cache decoder whose prefill (4 tokens) and decode (1 token) are methods of their own
/// applies the same weights to activations of other shapes: one packing serves both, as in
/// ExecuTorch's cache (a weight's identity covers what XNNPACK packs from, which the batch or
/// sequence length of its input is not). Decode, loaded after prefill, packs nothing.
#[test]
fn prefill_and_decode_methods_share_one_packing_of_each_weight() {
    let dir = data().join("export");
    let out = scratch("prefill-decode-packing");
    let calls: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("shared_prefill_decode.calls.json")).unwrap(),
    )
    .unwrap();
    let packed = |tag: &str, calls: &[serde_json::Value]| {
        let cache = out.join(format!("{tag}.xbc"));
        let mut args = vec![dir.join("shared_prefill_decode.pte").display().to_string()];
        for c in calls {
            args.extend([s("--call"), call_arg(&dir, c)]);
        }
        args.extend([s("--cache"), cache.display().to_string()]);
        run_ok(&args).cache(&cache.display().to_string())["packed"]
    };
    let all = calls["calls"].as_array().unwrap();
    let prefill_only = packed("prefill", &all[..1]);
    assert!(
        prefill_only > 10,
        "{prefill_only} weights packed for prefill"
    );
    assert_eq!(
        packed("both", all),
        prefill_only,
        "decode packs nothing more"
    );
}
