//! Cache files that lie, through a real XNNPACK runtime. Once per process, the fixture graphs
//! that pack weights are compiled against a new cache file (packing and saving it) and run
//! without one for reference outputs. Each input is a script of edits to that file's index
//! (an entry's size or offset moved, two entries' keys swapped, a key's byte changed, one key
//! copied over another), after which every checksum is recomputed, so the file is consistent
//! and only its contents lie. The graphs are then compiled against the edited file and run.
//!
//! Asserted: nothing crashes or reads outside the mapping (a short entry must never be handed to
//! an operator that reads more), and the outputs are the reference's bit for bit, unless the
//! file, as decoded, serves some key another entry's bytes of the size that key had: that is
//! tampering, which checksums do not claim to catch (docs/cache-format.md, threat model).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use xnnblob::backend::{Backend, BackendOptions, WeightsCacheChoice};
use xnnblob::cache::format::{self, Compat, EntryKey, FileEntry};
use xnnblob::delegate::XnnDelegate;

/// The fixture graphs whose weights go through the cache.
const GRAPHS: [&str; 4] = ["fc_fp32", "fc_qd8_qc8w", "fc_qd8_qb4w", "conv"];

struct Base {
    /// The cache file the graphs packed.
    bytes: Vec<u8>,
    compat: Compat,
    /// Each entry's key, with the size and checksum it was written with.
    written: HashMap<EntryKey, (u64, u64)>,
    /// Each graph's outputs without a cache file.
    reference: Vec<Vec<Vec<f32>>>,
}

fn inputs_of(delegate: &XnnDelegate) -> Vec<Vec<f32>> {
    delegate
        .input_shapes()
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let n: usize = dims.iter().product();
            (0..n)
                .map(|k| ((k * 7 + i * 3) % 17) as f32 / 8.0 - 1.0)
                .collect()
        })
        .collect()
}

/// Compiles and runs every graph with `cache`; the outputs, or None where a graph failed to
/// compile or run (a clean error).
fn run_all(backend: &Backend, cache: &WeightsCacheChoice) -> Vec<Option<Vec<Vec<f32>>>> {
    let model = backend.model(Some(cache)).expect("a model context");
    GRAPHS
        .iter()
        .map(|name| {
            let graph = xnnblob_fuzz::graph(name);
            let map = xnnblob_fuzz::named_data();
            let mut delegate =
                XnnDelegate::init(&model, xnnblob_fuzz::buffer(&graph.payload), &**map).ok()?;
            let inputs = inputs_of(&delegate);
            let mut outputs: Vec<Vec<f32>> = delegate
                .outputs()
                .map(|e| vec![0f32; e.bound.dims().iter().product()])
                .collect();
            let ins: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            let mut outs: Vec<&mut [f32]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
            delegate.execute_f32(&ins, &mut outs).ok()?;
            Some(outputs)
        })
        .collect()
}

fn new_backend() -> Backend {
    Backend::new(BackendOptions {
        threads: 1,
        ..Default::default()
    })
    .expect("XNNPACK initialises")
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let path = xnnblob_fuzz::scratch_dir().join("base.xbc");
        let backend = new_backend();
        let packed = run_all(&backend, &WeightsCacheChoice::File(path.clone()));
        backend
            .file_cache(&path)
            .expect("the cache file is open")
            .wait_saved()
            .expect("the cold launch saved");
        drop(backend);
        let reference: Vec<Vec<Vec<f32>>> = run_all(&new_backend(), &WeightsCacheChoice::Disabled)
            .into_iter()
            .map(|o| o.expect("every fixture graph runs"))
            .collect();
        assert!(
            packed
                .into_iter()
                .map(|o| o.expect("runs cold"))
                .eq(reference.clone()),
            "a cold launch computes what no cache does"
        );
        let bytes = std::fs::read(&path).expect("the saved cache file");
        let compat = Compat {
            build_id: xnnblob::xnn::build_identifier().to_vec(),
            cpu_fingerprint: xnnblob::cache::cpu_fingerprint(),
        };
        let decoded = format::decode(&bytes, &compat).expect("a valid file");
        assert!(decoded.entries.len() >= 4, "the graphs packed weights");
        let written = decoded
            .entries
            .iter()
            .map(|e| (e.key, (e.size, e.checksum)))
            .collect();
        Base {
            bytes,
            compat,
            written,
            reference,
        }
    })
}

/// The file `base` with its index edited by `script` and every checksum recomputed.
fn edited(base: &Base, script: &[u8]) -> Vec<u8> {
    let bytes = &base.bytes;
    let decoded = format::decode(bytes, &base.compat).expect("a valid file");
    let index = format::index_offset(bytes).expect("an index") as usize;
    let mut entries: Vec<FileEntry> = decoded.entries.clone();
    let n = entries.len();
    for op in script.chunks(6) {
        let [kind, a, b, rest @ ..] = op else {
            break;
        };
        let (i, j) = (*a as usize % n, *b as usize % n);
        let value = rest.iter().fold(0u64, |v, &x| v << 8 | u64::from(x));
        match kind % 6 {
            // A size that lies: shorter or longer, at most to the index.
            0 => entries[i].size = value % (index as u64 + 1),
            // Two entries' keys swapped.
            1 => {
                let k = entries[i].key;
                entries[i].key = entries[j].key;
                entries[j].key = k;
            }
            // A region moved (aligned or not).
            2 => entries[i].offset = value % (index as u64 + 64),
            // One byte of a key changed.
            3 => {
                let at = value as usize % 68;
                let mut key = [0u8; 68];
                key[..32].copy_from_slice(&entries[i].key.kernel.0);
                key[32..64].copy_from_slice(&entries[i].key.bias.0);
                key[64..].copy_from_slice(&entries[i].key.seed.to_le_bytes());
                key[at] ^= (value >> 8) as u8 | 1;
                entries[i].key.kernel.0.copy_from_slice(&key[..32]);
                entries[i].key.bias.0.copy_from_slice(&key[32..64]);
                entries[i].key.seed = u32::from_le_bytes(key[64..].try_into().expect("4"));
            }
            // One key copied over another (a duplicate).
            4 => entries[j].key = entries[i].key,
            // A size moved by a little: one alignment step either way.
            _ => {
                entries[i].size = if value & 1 == 0 {
                    entries[i].size.saturating_sub(64)
                } else {
                    entries[i].size + 64
                }
            }
        }
    }
    // Consistent: each region's checksum is of the bytes it now names.
    format::reindexed(bytes, &entries, &decoded.sources).expect("an index")
}

/// Whether the file, as decoded, serves a key the bytes of another entry of the size that key
/// was written with: the one lie no check can see.
fn tampered(base: &Base, file: &[u8]) -> bool {
    let Ok(decoded) = format::decode(file, &base.compat) else {
        return false;
    };
    decoded.entries.iter().any(|e| {
        base.written
            .get(&e.key)
            .is_some_and(|&(size, sum)| size == e.size && sum != e.checksum)
    })
}

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    xnnblob_fuzz::record_input(data);
    let base = base();
    let file = edited(base, data);
    let path: PathBuf = xnnblob_fuzz::scratch_file("lookups.xbc", &file);
    // A launch of its own: its saves done before the next input replaces the file, so that no
    // cache of this one is still open (and found again by path) then.
    let backend = new_backend();
    let outputs = run_all(&backend, &WeightsCacheChoice::File(path.clone()));
    if let Ok(cache) = backend.file_cache(&path) {
        let _ = cache.wait_saved();
    }
    drop(backend);
    if tampered(base, &file) {
        return;
    }
    for ((name, got), want) in GRAPHS.iter().zip(outputs).zip(&base.reference) {
        let got = got.unwrap_or_else(|| panic!("{name}: fails with a lying cache file"));
        assert!(
            got == *want,
            "{name}: a lying cache file changed the outputs"
        );
    }
});
