//! Parsers of untrusted bytes on mutated real inputs, in the README's test command: the XNNPACK
//! payload through compilation to an XNNPACK runtime, and whole `.pte` programs (the plan
//! reader, stateful declarations, delegates) through loading every method. Each must return an
//! error or work: never panic, crash or hang. Deterministic (a fixed seed per case), so a failure
//! names the iteration that reproduces it. The coverage-guided fuzz targets are in `fuzz/`.

use crate::common;

use std::path::Path;
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{DataBuffer, InMemoryMap, NamedDataMap};
use xnnblob::program::Program;
use xnnblob_test_support::synthetic::SplitMix64;

/// One mutation of `seed`: flipped bits, overwritten bytes, a cut, a duplicated run, or a small
/// integer written where offsets and lengths live.
fn mutate(seed: &[u8], rng: &mut SplitMix64) -> Vec<u8> {
    let mut b = seed.to_vec();
    let edits = 1 + rng.next_u64() % 4;
    for _ in 0..edits {
        if b.is_empty() {
            break;
        }
        let at = (rng.next_u64() % b.len() as u64) as usize;
        match rng.next_u64() % 6 {
            0 => b[at] ^= 1 << (rng.next_u64() % 8),
            1 => b[at] = rng.next_u64() as u8,
            2 => b.truncate(at),
            3 => {
                let len = (rng.next_u64() % 64) as usize;
                let run: Vec<u8> = b[at..(at + len).min(b.len())].to_vec();
                let to = (rng.next_u64() % b.len() as u64) as usize;
                b.splice(to..to, run);
            }
            4 => {
                let v =
                    [0u32, 1, 0xffff_ffff, 0x7fff_ffff, 64, 4096][(rng.next_u64() % 6) as usize];
                for (i, byte) in v.to_le_bytes().iter().enumerate() {
                    if let Some(x) = b.get_mut(at + i) {
                        *x = *byte;
                    }
                }
            }
            _ => b[at] = 0,
        }
    }
    b
}

fn backend() -> Backend {
    Backend::new(BackendOptions::default()).unwrap()
}

/// The delegate payload and named data of a small generated qd8 model.
fn payload_seed(dir: &Path) -> (Vec<u8>, InMemoryMap) {
    use xnnblob_test_support::synthetic::model::{Dtype, ModelSpec, Preset, ensure};
    let spec = ModelSpec {
        preset: Preset::LlmLike,
        dtype: Dtype::Qd8,
        mib: 1,
        layers: 2,
    };
    let files = ensure(&spec, dir).unwrap();
    let ptd = xnnblob::named_data::FileDataMap::open_ptd(&files.ptd).unwrap();
    let mut map = InMemoryMap::new("seed");
    for i in 0..ptd.num_keys() {
        let key = ptd.key_at(i).unwrap();
        map.insert(key, ptd.get_data(key).unwrap().data(), 64, None)
            .unwrap();
    }
    (std::fs::read(&files.payload).unwrap(), map)
}

fn as_buffer(bytes: &[u8]) -> DataBuffer {
    let mut m = InMemoryMap::new("payload");
    m.insert("p", bytes, 64, None).unwrap();
    m.get_data("p").unwrap()
}

#[test]
fn mutated_xnnpack_payloads_compile_or_fail_cleanly() {
    let dir = common::scratch("mutated-payloads");
    let (seed, map) = payload_seed(&dir);
    let backend = backend();
    let model = backend.model(Some(&WeightsCacheChoice::Disabled)).unwrap();
    XnnDelegate::init(&model, as_buffer(&seed), &map).expect("the seed compiles");
    let mut rng = SplitMix64(0xF0F0);
    let mut compiled = 0;
    for i in 0..3000 {
        let bytes = mutate(&seed, &mut rng);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            XnnDelegate::init(&model, as_buffer(&bytes), &map).is_ok()
        }));
        match result {
            Ok(ok) => compiled += ok as usize,
            Err(_) => panic!("payload mutation {i} (seed 0xF0F0) panicked"),
        }
    }
    eprintln!("{compiled} of 3000 mutated payloads still compiled");
}

#[test]
fn mutated_programs_load_or_fail_cleanly() {
    let dir = common::scratch("mutated-programs");
    let data = common::dir();
    let backend = backend();
    for (name, ptds) in [
        ("mlp_xnn_external", vec!["mlp_xnn_external.ptd"]),
        ("stateful_shared", vec![]),
        (
            "two_methods_xnn_external",
            vec!["two_methods_xnn_external.ptd"],
        ),
    ] {
        let seed = std::fs::read(data.join(format!("{name}.pte"))).unwrap();
        let ptds: Vec<_> = ptds.iter().map(|p| data.join(p)).collect();
        let path = dir.join(format!("{name}.pte"));
        let mut rng = SplitMix64(name.len() as u64);
        for i in 0..200 {
            std::fs::write(&path, mutate(&seed, &mut rng)).unwrap();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let Ok(program) =
                    Program::load(&backend, &path, &ptds, Some(&WeightsCacheChoice::Disabled))
                else {
                    return;
                };
                for method in program.method_names() {
                    let _ = program.method(method);
                }
            }));
            assert!(result.is_ok(), "{name}: mutation {i} panicked");
        }
    }
}

#[test]
fn a_graph_with_a_node_nothing_reads_is_refused_not_aborted_on() {
    // Found by the mutations above: XNNPACK drops such a node but not what feeds it, then
    // aborts the process in its fusion pass.
    use xnnblob_test_support::builder::GraphBuilder;
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 16]);
    let w: Vec<f32> = (0..256).map(|i| i as f32 / 256.0).collect();
    let wv = g.constant_f32(&[16, 16], &w);
    let dead = g.convert_qd8(x);
    let _ = dead;
    let y = g.fully_connected(x, wv, None, f32::NEG_INFINITY, f32::INFINITY);
    g.output(y);
    let built = g.finish();
    let map = built.map("g").unwrap();
    let backend = backend();
    let model = backend.model(Some(&WeightsCacheChoice::Disabled)).unwrap();
    let e = XnnDelegate::init(&model, as_buffer(&built.payload), &map)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("which no node reads"), "{e}");
}

#[test]
fn a_payload_whose_flatbuffer_is_shorter_than_its_identifier_is_an_error() {
    // Found by the mutations above: the identifier check panicked on fewer than 8 bytes.
    let dir = common::scratch("short-flatbuffer");
    let (seed, map) = payload_seed(&dir);
    let backend = backend();
    let model = backend.model(Some(&WeightsCacheChoice::Disabled)).unwrap();
    let mut bytes = seed.clone();
    // The header's flatbuffer size (at byte 14: after 4 bytes, the magic, the header length
    // and the flatbuffer's offset) set to 4.
    bytes[14..18].copy_from_slice(&4u32.to_le_bytes());
    assert!(XnnDelegate::init(&model, as_buffer(&bytes), &map).is_err());
}
