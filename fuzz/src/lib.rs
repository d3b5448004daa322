//! What the fuzz targets and the corpus writer share, so that a seed and the fixed data a target
//! resolves it against come from one definition: the graphs (payloads and their named data),
//! the stateful methods, and the byte layouts the `state` and `capi` targets decode their
//! inputs with. Every fixture is deterministic: the corpus written by `write_corpus` refers to
//! named-data keys that the targets' own copies of the fixtures hold.

pub mod capi_input;
pub mod reader;
pub mod state_script;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use xnnblob::backend::{Backend, BackendOptions, ModelContext, WeightsCacheChoice};
use xnnblob::named_data::{DataBuffer, InMemoryMap, NamedDataMap};
use xnnblob_test_support::builder::{BuiltGraph, ConvGeometry, GraphBuilder};
use xnnblob_test_support::synthetic::SplitMix64;

/// The keys, sizes and values a stateful program's initial states may name (besides the
/// graphs' own constants): one key for each buffer size the state methods use, one of a size
/// none of them uses, and one no map holds.
pub const INITIAL_KEYS: [(&str, usize); 4] = [
    ("init_1x8", 8),
    ("init_4x8", 32),
    ("init_odd", 3),
    ("init_missing", 0),
];

/// Key of the zeros after the last constant: XNNPACK may read a few bytes past a constant.
const SLACK_KEY: &str = "xnnblob.slack";

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| rng.unit() * scale).collect()
}

/// A fully connected layer with bias and ReLU, fp32.
fn fc_fp32() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 16]);
    let w = g.constant_f32(&[8, 16], &values(128, 1, 0.25));
    let b = g.constant_f32(&[8], &values(8, 2, 0.1));
    let y = g.fully_connected(x, w, Some(b), 0.0, f32::INFINITY);
    g.output(y);
    g.finish()
}

/// Dynamically quantized activations times per-channel int8 weights (qd8 × qc8w).
fn fc_qd8_qc8w() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[2, 32]);
    let mut rng = SplitMix64(3);
    let q: Vec<i8> = (0..16 * 32)
        .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
        .collect();
    let xq = g.convert_qd8(x);
    let w = g.constant_qc8w(&[16, 32], &q, &[0.01; 16]);
    let y = g.fully_connected(xq, w, None, f32::NEG_INFINITY, f32::INFINITY);
    g.output(y);
    g.finish()
}

/// qd8 activations times 4-bit weights with a bf16 scale per group of 32 inputs (qb4w).
fn fc_qd8_qb4w() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 64]);
    let mut rng = SplitMix64(4);
    let nibbles: Vec<u8> = (0..16 * 64 / 2).map(|_| rng.next_u64() as u8).collect();
    // bf16 of 0.015625.
    let scales = vec![0x3c80u16; 16 * 2];
    let xq = g.convert_qd8(x);
    let w = g.constant_qb4w(&[16, 64], &nibbles, &scales, 32);
    let y = g.fully_connected(xq, w, None, f32::NEG_INFINITY, f32::INFINITY);
    g.output(y);
    g.finish()
}

/// Convolution, depthwise convolution, global average pooling, reshape.
fn conv() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 5, 5, 3]);
    let f = g.constant_f32(&[4, 3, 3, 3], &values(4 * 27, 5, 0.2));
    let b = g.constant_f32(&[4], &values(4, 6, 0.1));
    let geometry = ConvGeometry::square(3, 1);
    let y = g.conv2d(x, f, Some(b), geometry, 0.0, 6.0);
    let d = g.constant_f32(&[1, 3, 3, 4], &values(36, 7, 0.3));
    let stride2 = ConvGeometry {
        stride: (2, 2),
        ..geometry
    };
    let y = g.depthwise_conv2d(y, d, None, stride2, f32::NEG_INFINITY, f32::INFINITY);
    let y = g.global_avg_pool(y);
    let y = g.reshape(y, &[1, 4]);
    g.output(y);
    g.finish()
}

/// Binary and unary element-wise nodes on two inputs.
fn elementwise() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let a = g.input(&[2, 8]);
    let b = g.input(&[2, 8]);
    let s = g.add(a, b, -1.0, 1.0);
    let m = g.multiply(s, b);
    let c = g.clamp(m, -0.5, 0.5);
    let y = g.softmax(c);
    g.output(y);
    g.finish()
}

/// Transpose, slice and concatenation, with two outputs (one through an explicit copy).
fn shapes() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[2, 4]);
    let t = g.transpose(x, &[1, 0]);
    let s = g.slice(t, &[1, 0], &[2, 2]);
    let c = g.concat2(s, s, 0);
    g.output(c);
    g.output_copy(t);
    g.finish()
}

/// State methods: `state_add` reads state `[1, 8]` (external 1), adds input 0 and writes the
/// sum back (external 2); `state_get` copies state (external 0) to output 1; `state_set`
/// copies input 0 to state (external 1); `state_window` shifts a `[4, 8]` window (external 1)
/// by one row of input 0, writes it back (external 2) and returns a projection of it (3);
/// `state_fc` adds a projection of input 0 to state (external 1) and writes it back (2).
fn state_add() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 8]);
    let s = g.input(&[1, 8]);
    let y = g.add(x, s, f32::NEG_INFINITY, f32::INFINITY);
    g.output_copy(y);
    g.finish()
}

fn state_get() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let s = g.input(&[1, 8]);
    g.output_copy(s);
    g.finish()
}

fn state_set() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 8]);
    g.output_copy(x);
    g.finish()
}

fn state_window() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let tok = g.input(&[1, 8]);
    let window = g.input(&[4, 8]);
    let kept = g.slice(window, &[1, 0], &[3, 8]);
    let shifted = g.concat2(kept, tok, 0);
    g.output_copy(shifted);
    let flat = g.reshape(shifted, &[1, 32]);
    let w = g.constant_f32(&[8, 32], &values(256, 8, 0.2));
    let y = g.fully_connected(flat, w, None, f32::NEG_INFINITY, f32::INFINITY);
    g.output(y);
    g.finish()
}

fn state_fc() -> BuiltGraph {
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, 8]);
    let s = g.input(&[1, 8]);
    let w = g.constant_f32(&[8, 8], &values(64, 9, 0.3));
    let y = g.fully_connected(x, w, None, f32::NEG_INFINITY, f32::INFINITY);
    let y = g.add(y, s, -4.0, 4.0);
    g.output_copy(y);
    g.finish()
}

/// Every graph of the fixtures, by name, in a fixed order: the seeds of the `payload` and
/// `plan` targets, and the state methods (the `state_*` ones).
pub fn graphs() -> &'static [(&'static str, BuiltGraph)] {
    static GRAPHS: OnceLock<Vec<(&'static str, BuiltGraph)>> = OnceLock::new();
    GRAPHS.get_or_init(|| {
        vec![
            ("fc_fp32", fc_fp32()),
            ("fc_qd8_qc8w", fc_qd8_qc8w()),
            ("fc_qd8_qb4w", fc_qd8_qb4w()),
            ("conv", conv()),
            ("elementwise", elementwise()),
            ("shapes", shapes()),
            ("state_add", state_add()),
            ("state_get", state_get()),
            ("state_set", state_set()),
            ("state_window", state_window()),
            ("state_fc", state_fc()),
        ]
    })
}

/// The graph called `name`.
pub fn graph(name: &str) -> &'static BuiltGraph {
    &graphs()
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no fixture graph {name:?}"))
        .1
}

/// The value of the initial-state key `key` (element `i` is `i + 1`), `None` for the key no
/// map holds.
pub fn initial_value(key: &str) -> Option<Vec<f32>> {
    let &(_, n) = INITIAL_KEYS.iter().find(|(k, _)| *k == key)?;
    (key != "init_missing").then(|| (0..n).map(|i| (i + 1) as f32).collect())
}

/// Every blob of the fixtures once, by key: the graphs' constants, the initial states, and
/// zeros to keep XNNPACK's over-reads inside the data.
pub fn blobs() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for (_, g) in graphs() {
        for (key, bytes) in &g.blobs {
            if !out.iter().any(|(k, _)| k == key) {
                out.push((key.clone(), bytes.clone()));
            }
        }
    }
    for (key, _) in INITIAL_KEYS {
        if let Some(v) = initial_value(key) {
            out.push((
                key.to_string(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ));
        }
    }
    out.push((SLACK_KEY.to_string(), vec![0; 64]));
    out
}

/// [`blobs`] as one in-memory map, made once per process: the external named data every
/// payload and program of the corpus resolves its constants in.
pub fn named_data() -> &'static Arc<InMemoryMap> {
    static MAP: OnceLock<Arc<InMemoryMap>> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = InMemoryMap::new("fuzz fixtures");
        for (key, bytes) in blobs() {
            map.insert(&key, &bytes, 64, None).expect("distinct keys");
        }
        Arc::new(map)
    })
}

/// A backend with default options (one thread), made once per process.
pub fn backend() -> &'static Backend {
    static BACKEND: OnceLock<Backend> = OnceLock::new();
    BACKEND.get_or_init(|| Backend::new(BackendOptions::default()).expect("XNNPACK initialises"))
}

/// A model context without a packed-weight cache, made once per process: every input packs
/// afresh, so no run depends on what an earlier one left in a cache.
pub fn model() -> &'static ModelContext {
    static MODEL: OnceLock<ModelContext> = OnceLock::new();
    MODEL.get_or_init(|| {
        backend()
            .model(Some(&WeightsCacheChoice::Disabled))
            .expect("a model context")
    })
}

/// `bytes` copied into a 64-aligned buffer of their own, as a delegate's payload arrives.
pub fn buffer(bytes: &[u8]) -> DataBuffer {
    let mut map = InMemoryMap::new("fuzz input");
    map.insert("input", bytes, 64, None).expect("one key");
    map.get_data("input").expect("just inserted")
}

/// The address space a fuzz target's process may use (`RLIMIT_AS`): 2 GiB, libFuzzer's default
/// RSS limit. A graph may declare tensors or convolutions whose buffers XNNPACK sizes from the
/// declaration (gigabytes from a kilobyte of payload) and zeroes; under the cap their allocation
/// fails and the call returns an error, instead of the process touching them and libFuzzer
/// reporting the input as out of memory. An allocation that aborts the process instead (an
/// infallible one sized from the input) is still reported: that is a finding.
pub const ADDRESS_SPACE_LIMIT: u64 = 2 << 30;

/// Caps this process's address space at [`ADDRESS_SPACE_LIMIT`] (never raises it); every target
/// calls it first.
pub fn limit_address_space() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write into; RLIMIT_AS is a valid resource.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 {
        return;
    }
    limit.rlim_cur = limit.rlim_cur.min(ADDRESS_SPACE_LIMIT);
    // SAFETY: as above; the soft limit stays at or below the hard one.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
}

/// This process's scratch directory (made on first use, removed at exit): inputs that the code
/// under test only reads from a path are written here.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("xnnblob-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        extern "C" fn remove_scratch() {
            if let Some(dir) = DIR.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: `remove_scratch` is a plain function that neither unwinds nor calls exit;
        // registering it has no other precondition. A failed registration only leaves the
        // directory behind.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

/// With `XNNBLOB_FUZZ_LAST_INPUT=FILE` set, writes each input there before it runs. Memory
/// corruption inside XNNPACK can leave libFuzzer's crash handler deadlocked in the allocator
/// before it saves the input; the file still holds it.
pub fn record_input(data: &[u8]) {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    if let Some(path) =
        PATH.get_or_init(|| std::env::var_os("XNNBLOB_FUZZ_LAST_INPUT").map(PathBuf::from))
    {
        let _ = std::fs::write(path, data);
    }
}

/// Puts `bytes` at `name` in the scratch directory and returns the path. The file is replaced
/// (written beside it, then renamed over it), never rewritten in place: a mapping of the last
/// input that something still holds keeps its own bytes instead of faulting on a shorter file.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = scratch_dir();
    let path = dir.join(name);
    let temporary = dir.join(format!("{name}.new"));
    std::fs::write(&temporary, bytes).expect("writing a scratch file");
    std::fs::rename(&temporary, &path).expect("renaming a scratch file");
    path
}
