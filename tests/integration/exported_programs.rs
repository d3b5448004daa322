//! Programs exported by ExecuTorch 1.5.1 (`tests/data/executorch/export`, from
//! scripts/export-executorch-fixtures.py; outputs from ExecuTorch's own runtime and XNNPACK
//! backend): every node type its lowering emits, in fp32, fp16 and static int8, and small real
//! architectures. Here in xnnblob's own executor where the whole method is delegated (ExecuTorch's
//! runtime runs all of them in faces/executorch's tests), and the two node types ExecuTorch 1.5.1
//! does not lower (ELU, scaled dot-product attention) from payloads built here, against a plain
//! reference.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use xnnblob::backend::Backend;
use xnnblob::delegate::{XnnDelegate, summarize};
use xnnblob::named_data::{DataBuffer, FileDataMap, InMemoryMap, NamedDataMap};
use xnnblob::program::ProgramError;
use xnnblob_test_support::builder::GraphBuilder;

use crate::common;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/export")
}

fn io(name: &str) -> Value {
    common::io_steps::io(&dir(), name)
}

fn tolerance(name: &str) -> f32 {
    if name.contains("int8") || name.contains("8da4w") || name.contains("8da8w") {
        1e-3
    } else if name.contains("fp16") {
        2e-3
    } else {
        1e-5
    }
}

#[test]
fn fully_delegated_programs_match_executorch_in_xnnblobs_own_executor() {
    let backend = Backend::with_defaults().unwrap();
    let (mut ran, mut not_delegated, mut other_layouts) = (Vec::new(), Vec::new(), Vec::new());
    for name in common::exported_names() {
        let io = io(&name);
        let program = common::io_steps::load(&backend, &dir(), &io, &name, None);
        let method = program.method(io["method"].as_str().unwrap());
        let mut method = match method {
            Ok(m) => m,
            Err(ProgramError::NotDelegated { operator, .. }) => {
                not_delegated.push(format!("{name} ({operator})"));
                continue;
            }
            // This executor takes tensors in their default dim order only, and says so (the
            // drop-in runs these in faces/executorch's tests).
            Err(ProgramError::BadPlan { reason, .. }) if reason.contains("dim order") => {
                other_layouts.push(name);
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        let worst = common::io_steps::run_steps(&dir(), &io, &mut method, &name, true);
        assert!(
            worst <= tolerance(&name),
            "{name}: {worst} of the range from ExecuTorch's outputs"
        );
        ran.push(format!("{name} {worst:.1e}"));
    }
    eprintln!("ran in xnnblob's executor: {ran:?}\nnot fully delegated: {not_delegated:?}");
    assert_eq!(
        other_layouts,
        ["layout_channels_last_fp32"],
        "only the channels-last export is refused for its layout"
    );
    // Which kernel family this CPU (or the emulated one) dispatches to.
    let kernel = xnnblob::xnn::qd8_gemm_kernel(xnnblob::xnn::Qd8Weights::Qc8w).unwrap();
    eprintln!("qd8 x qc8w GEMM kernel: {}", kernel.unwrap_or_default());
    assert!(
        ran.len() >= 8,
        "most exported programs are fully delegated: {ran:?}"
    );
}

/// Node types ExecuTorch 1.5.1 cannot emit: its partitioner has no configuration for ELU (the
/// config is commented out in the wheel) nor for scaled dot-product attention (its runtime does
/// not define that node either), and lowers max.dim only when its indices go unused, as max
/// pooling, never as argmax pooling.
const NOT_LOWERED_BY_EXECUTORCH: [&str; 3] = [
    "XNNELU",
    "XNNScaledDotProductAttention",
    "XNNArgMaxPooling2d",
];

#[test]
fn exported_programs_hold_every_node_type_executorch_lowers_and_all_are_defined() {
    let schema: BTreeSet<&str> = xnnblob::delegate::operators::schema_node_types().collect();
    assert_eq!(
        schema.len(),
        47,
        "ExecuTorch 1.5.1's schema has 47 node types"
    );
    for name in &schema {
        assert!(
            xnnblob::delegate::operators::is_supported(name),
            "{name} is in the operator table"
        );
    }
    let mut seen = BTreeSet::new();
    for name in common::exported_names() {
        let map = FileDataMap::open(dir().join(format!("{name}.pte"))).unwrap();
        for (method, payloads) in xnnblob::program::delegate_payloads(&map).unwrap() {
            for p in payloads {
                let summary = summarize(&p).unwrap_or_else(|e| panic!("{name} {method}: {e}"));
                assert!(summary.supported(), "{name}: {summary:?}");
                seen.extend(summary.nodes.into_iter().map(|(n, _, _)| n));
            }
        }
    }
    let missing: Vec<&&str> = schema
        .iter()
        .filter(|n| !seen.contains(**n) && !NOT_LOWERED_BY_EXECUTORCH.contains(n))
        .collect();
    assert!(missing.is_empty(), "no exported program holds {missing:?}");
}

/// A delegate packs weights, and so asks a weights cache, exactly where one of its nodes is of
/// a kind XNNPACK packs a constant operand of: the ExecuTorch face opens no cache file for a
/// program of delegates that pack none. Every exported delegate, against its node types; both
/// kinds are among them. A payload that is not one is refused, as an init refuses it.
#[test]
fn a_delegate_packs_weights_exactly_where_a_node_of_it_packs_an_operand() {
    const PACKING: [&str; 5] = [
        "XNNFullyConnected",
        "XNNConv2d",
        "XNNDepthwiseConv2d",
        "XNNConvTranspose2d",
        "XNNBatchMatrixMultiply",
    ];
    let (mut packing, mut not) = (0, 0);
    for name in common::exported_names() {
        let map = FileDataMap::open(dir().join(format!("{name}.pte"))).unwrap();
        for (method, payloads) in xnnblob::program::delegate_payloads(&map).unwrap() {
            for p in payloads {
                let summary = summarize(&p).unwrap();
                let packs = summary
                    .nodes
                    .iter()
                    .any(|(node, _, _)| PACKING.contains(&node.as_str()));
                assert_eq!(
                    xnnblob::delegate::packs_weights(&p).unwrap(),
                    packs,
                    "{name} {method}: {summary:?}"
                );
                if packs {
                    packing += 1;
                } else {
                    not += 1;
                }
            }
        }
    }
    assert!(
        packing > 0 && not > 0,
        "{packing} delegates pack, {not} do not"
    );
    assert!(xnnblob::delegate::packs_weights(b"XH00 and nothing else").is_err());
}

fn payload(bytes: &[u8]) -> DataBuffer {
    let mut map = InMemoryMap::new("payload");
    map.insert("p", bytes, 64, None).unwrap();
    map.get_data("p").unwrap()
}

fn elu(x: f32, alpha: f32) -> f32 {
    if x > 0.0 { x } else { alpha * (x.exp() - 1.0) }
}

#[test]
fn elu_and_attention_which_executorch_does_not_lower_match_a_reference() {
    // ELU: [2, 8], alpha 0.7.
    let mut g = GraphBuilder::new();
    let x = g.input(&[2, 8]);
    let y = g.elu(x, 0.7);
    g.output(y);
    let built = g.finish();
    let model = common::model_of(&common::new_backend(), None);
    let map = built.map("elu").unwrap();
    let mut d = XnnDelegate::init(&model, payload(&built.payload), &map).unwrap();
    let input: Vec<f32> = (0..16).map(|i| (i as f32 - 8.0) * 0.37).collect();
    let mut got = vec![f32::NAN; 16];
    d.execute_f32(&[&input], &mut [&mut got]).unwrap();
    let want: Vec<f32> = input.iter().map(|&v| elu(v, 0.7)).collect();
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "elu: {a} against {b}"
        );
    }

    // Attention over 2 heads: query [2, 3, 4], key and value [2, 5, 4], a scale per channel and
    // a causal-style additive mask [3, 5].
    let (h, t, s, c) = (2usize, 3usize, 5usize, 4usize);
    let mut g = GraphBuilder::new();
    let q = g.input(&[h as u32, t as u32, c as u32]);
    let k = g.input(&[h as u32, s as u32, c as u32]);
    let v = g.input(&[h as u32, s as u32, c as u32]);
    let scale_data = [0.5f32, 0.5, 0.5, 0.5];
    let mask_data: Vec<f32> = (0..t * s)
        .map(|i| if i % s > i / s + 2 { -1e4 } else { 0.0 })
        .collect();
    let scale = g.constant_f32(&[c as u32], &scale_data);
    let mask = g.constant_f32(&[t as u32, s as u32], &mask_data);
    let o = g.attention(q, k, v, scale, mask);
    g.output(o);
    let built = g.finish();
    let map = built.map("attention").unwrap();
    let mut d = XnnDelegate::init(&model, payload(&built.payload), &map).unwrap();
    let wave = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.731 + seed).sin()) * 1.3)
            .collect()
    };
    let (qd, kd, vd) = (
        wave(h * t * c, 0.1),
        wave(h * s * c, 0.7),
        wave(h * s * c, 1.9),
    );
    let mut got = vec![f32::NAN; h * t * c];
    d.execute_f32(&[&qd, &kd, &vd], &mut [&mut got]).unwrap();
    let mut want = vec![0f32; h * t * c];
    for hh in 0..h {
        for tt in 0..t {
            let logits: Vec<f32> = (0..s)
                .map(|ss| {
                    let dot: f32 = (0..c)
                        .map(|cc| {
                            qd[(hh * t + tt) * c + cc] * scale_data[cc] * kd[(hh * s + ss) * c + cc]
                        })
                        .sum();
                    dot + mask_data[tt * s + ss]
                })
                .collect();
            let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f32 = exps.iter().sum();
            for cc in 0..c {
                want[(hh * t + tt) * c + cc] = (0..s)
                    .map(|ss| exps[ss] / total * vd[(hh * s + ss) * c + cc])
                    .sum();
            }
        }
    }
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-4, "attention: {a} against {b}");
    }
}

/// The exported programs and the hand-built nodes again on an AVX2-only CPU (emulated: qemu has
/// no AVX-512), where XNNPACK dispatches its AVX2 kernel families instead of this machine's.
#[cfg(target_arch = "x86_64")]
#[test]
fn exported_programs_also_match_on_an_avx2_only_cpu() {
    common::assert_pass_on_emulated_cpu(
        module_path!(),
        "Haswell-v4",
        "__avx2",
        &[
            "fully_delegated_programs_match_executorch_in_xnnblobs_own_executor",
            "elu_and_attention_which_executorch_does_not_lower_match_a_reference",
        ],
    );
}

#[test]
fn a_warm_launch_of_every_exported_program_packs_nothing() {
    // Whatever the operator: deconvolutions (the UNet's, op_deconv's), depthwise and 1x1
    // depthwise-as-multiply convolutions once packed before their look-up, so every warm launch
    // packed them again (XNNPACK patch 0023); NHWC depthwise convolutions were created without
    // the cache, and packed their weights at every launch where no count saw it (patch 0025):
    // every convolution node's weights are found.
    let scratch = common::scratch("warm-packs-nothing");
    let mut checked = Vec::new();
    for name in common::exported_names() {
        let io = io(&name);
        let cache = xnnblob::backend::WeightsCacheChoice::File(scratch.join(format!("{name}.xbc")));
        let launch = || {
            let backend = Backend::with_defaults().unwrap();
            let program = common::io_steps::load(&backend, &dir(), &io, &name, Some(&cache));
            let loaded = program.method(io["method"].as_str().unwrap()).is_ok();
            let stats = program.weights_cache().map(|c| {
                c.wait_saved().unwrap();
                c.stats()
            });
            (loaded, stats)
        };
        let (loaded, cold) = launch();
        let (Some(cold), true) = (cold, loaded) else {
            continue;
        };
        let (_, warm) = launch();
        let warm = warm.unwrap();
        assert_eq!(
            warm.packed, 0,
            "{name}: the warm launch packed {} weights (cold: {} packed, {} found)",
            warm.packed, cold.packed, cold.hits
        );
        if cold.packed > 0 {
            // Each convolution node, of every kind, packs its weights.
            let convolutions = common::delegate_nodes(
                &dir().join(format!("{name}.pte")),
                &["XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d"],
            );
            assert!(
                warm.hits > 0 && warm.hits >= convolutions,
                "{name}: the warm launch found {} packed weights for {convolutions} convolutions",
                warm.hits
            );
            checked.push(name);
        }
    }
    for needed in [
        "arch_unet_fp32",
        "op_deconv_fp32",
        "arch_mobilenet_v2_fp32",
        "arch_mobilenet_v2_int8",
    ] {
        assert!(
            checked.iter().any(|n| n == needed),
            "{needed} was checked: {checked:?}"
        );
    }
}
