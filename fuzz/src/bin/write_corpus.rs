//! Writes the checked-in seed corpus, `fuzz/corpus/<target>/`, with xnnblob's own writers: the
//! fixture graphs' payloads (`GraphBuilder`), programs around them (`program_writer`), named data
//! (`NamedBlobStore`), a packed-weight cache file made by packing the graphs, and scripts of the
//! `state` and `capi` targets' input formats. Run by `scripts/fuzz.sh corpus`; each target's
//! seeds are replaced whole, so re-running after a fixture changes leaves no stale seed, while
//! the inputs kept from crashes (`regression-*`) stay.

use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{NamedBlobStore, ScalarType, TensorLayout};
use xnnblob_fuzz::capi_input::{self as capi, CapiInput};
use xnnblob_fuzz::state_script::{Binding, Decl, MethodDecl, Op, Script};
use xnnblob_test_support::program_writer::DelegatedProgram;

type Seeds = Vec<(String, Vec<u8>)>;

fn program(graph: &xnnblob_test_support::builder::BuiltGraph, method: &str) -> Vec<u8> {
    DelegatedProgram {
        method,
        payload: &graph.payload,
        externals: &graph.externals,
    }
    .serialize()
}

/// Every fixture blob in one `.ptd`, aligned as ExecuTorch asks for XNNPACK's constants.
fn fixtures_ptd() -> Vec<u8> {
    let mut store = NamedBlobStore::new();
    for (key, bytes) in xnnblob_fuzz::blobs() {
        store
            .add_named_blob(&key, &bytes, 16, "model", None)
            .expect("distinct keys");
    }
    store.serialize("model").expect("one tag")
}

/// Blobs with tensor layouts, other alignments, an empty blob and a blob shared by two keys.
fn layouts_ptd() -> Vec<u8> {
    let floats: Vec<u8> = (0..24u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut store = NamedBlobStore::new();
    let layout = |t, sizes: Vec<i32>| Some(TensorLayout::contiguous(t, sizes).expect("valid"));
    let add = |store: &mut NamedBlobStore, key, bytes: &[u8], align, l| {
        store
            .add_named_blob(key, bytes, align, "model", l)
            .expect("a valid blob");
    };
    add(
        &mut store,
        "weight",
        &floats,
        64,
        layout(ScalarType::Float, vec![2, 3, 4]),
    );
    add(&mut store, "same_bytes", &floats, 16, None);
    add(
        &mut store,
        "bytes",
        &floats[..10],
        4096,
        layout(ScalarType::Byte, vec![10]),
    );
    add(
        &mut store,
        "empty",
        &[],
        16,
        layout(ScalarType::Float, vec![0, 4]),
    );
    let permuted = TensorLayout::new(ScalarType::Half, vec![4, 3], vec![1, 0]).expect("valid");
    add(&mut store, "half_t", &floats[..24], 32, Some(permuted));
    store.serialize("model").expect("one tag")
}

/// A cache file holding every fixture graph's packed weights, as a cold launch saves it.
fn fixtures_cache(dir: &Path) -> Vec<u8> {
    let path = dir.join("fixtures.xbc");
    let _ = std::fs::remove_file(&path);
    let backend = Backend::new(BackendOptions::default()).expect("XNNPACK initialises");
    let model = backend
        .model(Some(&WeightsCacheChoice::File(path.clone())))
        .expect("a cache file in a fresh directory");
    let map = xnnblob_fuzz::named_data();
    let delegates: Vec<XnnDelegate> = xnnblob_fuzz::graphs()
        .iter()
        .map(|(name, g)| {
            XnnDelegate::init(&model, xnnblob_fuzz::buffer(&g.payload), &**map)
                .unwrap_or_else(|e| panic!("fixture {name} compiles: {e}"))
        })
        .collect();
    let cache = model.packed_cache().expect("a file cache");
    cache.finalize().expect("a save");
    cache.wait_saved().expect("a durable save");
    drop(delegates);
    std::fs::read(&path).expect("the saved cache file")
}

fn decl(name: usize, dims: &[usize], bank: usize, initial: usize) -> Decl {
    Decl {
        name,
        dims: dims.to_vec(),
        bank,
        initial,
    }
}

fn bind(external: u32, state: usize) -> Binding {
    Binding { external, state }
}

fn method(name: usize, graph: usize, reads: Vec<Binding>, writes: Vec<Binding>) -> MethodDecl {
    MethodDecl {
        name,
        graph,
        reads,
        writes,
    }
}

/// Programs that run (an accumulator, a sliding window with named initial values in two
/// banks), and declarations each of which one check refuses.
fn state_scripts() -> Seeds {
    // Indices: STATE_NAMES s=0 window=1 cross=2 ""=3, unknown=4; STATE_GRAPHS add=0 get=1
    // set=2 window=3 fc=4; METHOD_NAMES mirror the graphs, other=5; initial keys 1=init_1x8,
    // 2=init_4x8, 3=init_odd, 4=init_missing, 5=a 128-float constant.
    let accumulator = Script {
        decls: vec![decl(0, &[1, 8], 0, 0)],
        methods: vec![
            method(0, 0, vec![bind(1, 0)], vec![bind(2, 0)]),
            method(1, 1, vec![bind(0, 0)], vec![]),
            method(2, 2, vec![], vec![bind(1, 0)]),
        ],
        ops: vec![
            Op::Instantiate,
            Op::Execute(2, vec![8]),
            Op::Execute(0, vec![8]),
            Op::Read(0),
            Op::Execute(1, vec![]),
            Op::Reset,
            Op::Read(0),
        ],
    };
    let window = Script {
        decls: vec![
            decl(1, &[4, 8], 0, 2),
            decl(0, &[1, 8], 1, 1),
            decl(2, &[16, 8], 1, 5),
        ],
        methods: vec![
            method(3, 3, vec![bind(1, 1)], vec![bind(2, 1)]),
            method(4, 4, vec![bind(1, 0)], vec![bind(2, 0)]),
        ],
        ops: vec![
            Op::Instantiate,
            Op::Execute(3, vec![8]),
            Op::Execute(3, vec![8]),
            Op::Read(1),
            Op::Execute(4, vec![8]),
            Op::InstantiateIn {
                banks_delta: 1,
                size_delta: 0,
            },
            Op::Load(3),
            Op::Execute(3, vec![8]),
            Op::Reset,
            Op::Read(2),
        ],
    };
    let refused = |decls: Vec<Decl>, methods: Vec<MethodDecl>| Script {
        decls,
        methods,
        ops: vec![Op::Instantiate],
    };
    let huge = usize::MAX / 2;
    let scripts = [
        ("accumulator", accumulator),
        ("window", window),
        (
            "duplicate_name",
            refused(vec![decl(0, &[1, 8], 0, 0), decl(0, &[2], 1, 0)], vec![]),
        ),
        (
            "unknown_binding",
            refused(
                vec![decl(0, &[1, 8], 0, 0)],
                vec![method(0, 0, vec![bind(1, 4)], vec![])],
            ),
        ),
        (
            "initial_wrong_size",
            refused(vec![decl(0, &[1, 8], 0, 3)], vec![]),
        ),
        (
            "initial_missing",
            refused(vec![decl(0, &[1, 8], 0, 4)], vec![]),
        ),
        (
            "size_overflows",
            refused(vec![decl(0, &[huge, 3], 0, 0)], vec![]),
        ),
        (
            "bank_overflows",
            refused(vec![decl(0, &[1, 8], usize::MAX, 0)], vec![]),
        ),
        (
            "wrong_banks",
            Script {
                decls: vec![decl(0, &[1, 8], 1, 0)],
                methods: vec![method(0, 0, vec![bind(1, 0)], vec![bind(2, 0)])],
                ops: vec![
                    Op::InstantiateIn {
                        banks_delta: 1,
                        size_delta: -1,
                    },
                    Op::InstantiateIn {
                        banks_delta: 2,
                        size_delta: 0,
                    },
                    Op::InstantiateIn {
                        banks_delta: 1,
                        size_delta: 64,
                    },
                    Op::Execute(0, vec![8, 8]),
                    Op::Execute(0, vec![3]),
                ],
            },
        ),
    ];
    scripts
        .into_iter()
        .map(|(name, s)| {
            let bytes = s.encode();
            assert_eq!(Script::decode(&bytes), s, "{name} round-trips");
            (name.to_string(), bytes)
        })
        .collect()
}

fn capi_seeds(ptd: &[u8], layouts: &[u8], pte: &[u8], cache: &[u8]) -> Seeds {
    let first_key = xnnblob_fuzz::blobs()[0].0.clone();
    let first_len = xnnblob_fuzz::blobs()[0].1.len() as u16;
    let seed = |flags: u8, key: &str, size: u16, file: &[u8]| {
        let inp = CapiInput {
            flags,
            key: key.as_bytes(),
            size,
            index: 0,
            register: 64,
            digest: if flags & capi::GIVEN_DIGEST != 0 {
                [7; 32]
            } else {
                [0; 32]
            },
            file,
        };
        let bytes = inp.encode();
        assert_eq!(CapiInput::decode(&bytes), inp, "round-trips");
        bytes
    };
    let one_thread = 1 << capi::THREADS_SHIFT;
    vec![
        ("ptd".into(), seed(capi::MAP, &first_key, first_len, ptd)),
        (
            "layouts".into(),
            seed(capi::MAP | capi::CACHE, "weight", 96, layouts),
        ),
        ("pte".into(), seed(capi::MAP, "forward", 0, pte)),
        (
            "cache".into(),
            seed(
                capi::CACHE | capi::FIX_HEADER | capi::FINALIZE,
                "",
                0,
                cache,
            ),
        ),
        (
            "cache_backend".into(),
            seed(
                capi::CACHE | capi::VIA_BACKEND | capi::GIVEN_DIGEST | one_thread,
                "",
                0,
                cache,
            ),
        ),
    ]
}

/// Inputs that once crashed a target (or made it run out of memory), kept beside the seeds for
/// good: their names start with this, and rewriting the seeds leaves them alone.
const REGRESSION: &str = "regression-";

fn write(root: &Path, target: &str, seeds: &Seeds) {
    let dir = root.join(target);
    std::fs::create_dir_all(&dir).expect("a corpus directory");
    for entry in std::fs::read_dir(&dir).expect("the corpus directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !name.starts_with(REGRESSION) {
            std::fs::remove_file(&path).expect("removing an old seed");
        }
    }
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("writing a seed");
    }
    let total: usize = seeds.iter().map(|(_, b)| b.len()).sum();
    println!("{target}: {} seeds, {total} bytes", seeds.len());
}

fn main() {
    let root: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let graphs = xnnblob_fuzz::graphs();
    let payloads: Seeds = graphs
        .iter()
        .map(|(name, g)| (format!("{name}.xnn"), g.payload.clone()))
        .collect();
    let programs: Seeds = graphs
        .iter()
        .map(|(name, g)| (format!("{name}.pte"), program(g, "forward")))
        .collect();
    let ptd = fixtures_ptd();
    let layouts = layouts_ptd();
    let scratch = xnnblob_fuzz::scratch_dir();
    let cache = fixtures_cache(scratch);

    write(&root, "payload", &payloads);
    let graphs_alone: Seeds = graphs
        .iter()
        .map(|(name, g)| {
            let p = xnnblob::delegate::payload::parse(&g.payload).expect("a fixture payload");
            let at = p.header.flatbuffer_offset as usize;
            let fb = g.payload[at..at + p.header.flatbuffer_size as usize].to_vec();
            (format!("{name}.fb"), fb)
        })
        .collect();
    write(&root, "graph_verifier", &graphs_alone);
    write(&root, "plan", &programs);
    write(&root, "pte", &programs);
    write(
        &root,
        "ptd",
        &vec![
            ("fixtures.ptd".into(), ptd.clone()),
            ("layouts.ptd".into(), layouts.clone()),
        ],
    );
    write(
        &root,
        "cache_file",
        &vec![
            ("fixtures.xbc".into(), cache.clone()),
            (
                "record.checked".into(),
                xnnblob::cache::format::CheckedRecord {
                    device: 2049,
                    inode: 1_234_567,
                    size: cache.len() as u64,
                    changed_ns: 1_795_586_801_276_556_200,
                }
                .to_text()
                .into_bytes(),
            ),
        ],
    );
    // Scripts of index edits (kind, entry, entry, 3 bytes of value; see the target): none, a
    // size cut to 64 bytes, two keys swapped, a region moved, a key byte changed, a key copied,
    // a size one alignment step short, and all of them at once.
    let edits: Seeds = [
        ("none", vec![]),
        ("short", vec![0, 0, 0, 0, 0, 64]),
        ("swapped", vec![1, 0, 1, 0, 0, 0]),
        ("moved", vec![2, 1, 0, 0, 0, 128]),
        ("key_byte", vec![3, 2, 0, 0, 7, 33]),
        ("duplicate", vec![4, 0, 2, 0, 0, 0]),
        ("one_step_short", vec![5, 3, 0, 0, 0, 0]),
    ]
    .into_iter()
    .map(|(name, script)| (format!("{name}.edits"), script))
    .collect();
    let all: Vec<u8> = edits.iter().flat_map(|(_, s)| s.clone()).collect();
    let mut edits = edits;
    edits.push(("all.edits".into(), all));
    write(&root, "cache_lookups", &edits);
    write(&root, "state", &state_scripts());
    write(
        &root,
        "capi",
        &capi_seeds(&ptd, &layouts, &programs[0].1, &cache),
    );
}
