//! Placeholder constants (`XnnDelegate::init_deferred`): a warm launch reads no weight byte from
//! the named-data map, whatever the map does on a read, and runs to the same outputs as the cold
//! launch that read and packed them.

use crate::common;

use common::{dir, f32s};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use xnnblob::backend::{Backend, PackedCache};
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{
    DataBuffer, FileDataMap, InMemoryMap, MergedMap, NamedDataError, NamedDataMap, TensorLayout,
};

/// A map that counts the bytes read through it, like a data loader that reads files into memory.
struct Counting {
    inner: MergedMap,
    /// Through `get_data` (constants read as they are).
    bytes_read: AtomicUsize,
    /// Through `load_data_into` (placeholders read in).
    bytes_filled: AtomicUsize,
}

impl NamedDataMap for Counting {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        let data = self.inner.get_data(key)?;
        self.bytes_read.fetch_add(data.len(), Ordering::Relaxed);
        Ok(data)
    }
    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        self.inner.data_size(key)
    }
    fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        self.inner.get_tensor_layout(key)
    }
    fn load_data_into(&self, key: &str, buffer: &mut [u8]) -> Result<(), NamedDataError> {
        self.inner.load_data_into(key, buffer)?;
        self.bytes_filled.fetch_add(buffer.len(), Ordering::Relaxed);
        Ok(())
    }
    fn num_keys(&self) -> usize {
        self.inner.num_keys()
    }
    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        self.inner.key_at(index)
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}

/// The payload and a counting map over the fixture's `.pte` named data and `.ptd` files.
fn open(name: &str) -> (DataBuffer, Arc<Counting>, usize) {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir().join(format!("{name}.json"))).unwrap())
            .unwrap();
    let pte_path = dir().join(manifest["pte"]["file"].as_str().unwrap());
    let pte = FileDataMap::open_pte(&pte_path).unwrap();
    let bytes = std::fs::read(&pte_path).unwrap();
    // The one delegate payload: the segment with XNNPACK's header magic.
    let &(offset, size) = pte
        .segments()
        .iter()
        .find(|&&(o, n)| n >= 8 && &bytes[o + 4..o + 8] == b"XH00")
        .expect("an XNNPACK payload segment");
    let mut m = InMemoryMap::new("payload");
    m.insert("p", &bytes[offset..offset + size], 64, None)
        .unwrap();
    let payload = m.get_data("p").unwrap();
    let mut maps: Vec<Arc<dyn NamedDataMap>> = vec![Arc::new(pte)];
    let mut total = 0;
    for ptd in manifest["ptd"].as_array().unwrap() {
        let path = dir().join(ptd["file"].as_str().unwrap());
        total += std::fs::metadata(&path).unwrap().len() as usize;
        maps.push(Arc::new(FileDataMap::open_ptd(path).unwrap()));
    }
    let map = Counting {
        inner: MergedMap::new(maps).unwrap(),
        bytes_read: AtomicUsize::new(0),
        bytes_filled: AtomicUsize::new(0),
    };
    (payload, Arc::new(map), total)
}

struct Launch {
    output: Vec<f32>,
    bytes_read: usize,
    bytes_filled: usize,
    fills: usize,
    packed: usize,
}

fn launch(name: &str, input: &str, cache: &std::path::Path) -> Launch {
    let (payload, map, _) = open(name);
    let backend = Backend::with_defaults().unwrap();
    let model = backend
        .model(Some(&PackedCache::File(cache.to_path_buf())))
        .unwrap();
    let mut d = XnnDelegate::init_deferred(&model, payload, map.clone())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let input = f32s(&dir().join(input));
    let n: usize = d.output_shapes()[0].iter().product();
    let mut output = vec![f32::NAN; n];
    d.execute_f32(&[&input], &mut [&mut output]).unwrap();
    let stats = model.packed_cache().unwrap().stats();
    model.packed_cache().unwrap().wait_saved().unwrap();
    Launch {
        output,
        bytes_read: map.bytes_read.load(Ordering::Relaxed),
        bytes_filled: map.bytes_filled.load(Ordering::Relaxed),
        fills: stats.deferred_fills,
        packed: stats.packed,
    }
}

#[test]
fn a_warm_launch_reads_no_weight_bytes_and_matches_the_cold_one() {
    // (fixture, input, whether its weights are mostly fully connected filters)
    for (name, input, mostly_filters) in [
        ("mlp_xnn_external", "mlp.input.f32", true),
        ("mlp_qd8_qc8w_external", "mlp_qd8.input.f32", true),
        ("cnn_xnn_external", "cnn.input.f32", false),
    ] {
        let dir = common::scratch("deferred");
        let cache = dir.join(format!("{name}.xbc"));
        let (_, _, weight_bytes) = open(name);

        let cold = launch(name, input, &cache);
        assert!(cold.packed > 0, "{name}: the cold launch packs");
        assert!(cold.fills > 0, "{name}: the cold launch reads weights in");
        assert!(cold.bytes_filled > 0, "{name}");

        let warm = launch(name, input, &cache);
        assert_eq!(warm.packed, 0, "{name}: the warm launch packs nothing");
        assert_eq!(warm.fills, 0, "{name}: no placeholder was read in");
        assert_eq!(warm.bytes_filled, 0, "{name}");
        // Only what an operator reads as it is (biases, depthwise filters), as cold did.
        assert_eq!(warm.bytes_read, cold.bytes_read, "{name}");
        if mostly_filters {
            assert!(
                warm.bytes_read * 20 < weight_bytes,
                "{name}: the warm launch read {} of {weight_bytes} weight bytes",
                warm.bytes_read
            );
        }
        assert_eq!(
            warm.output.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            cold.output.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{name}: warm and cold outputs are identical"
        );
        eprintln!(
            "{name}: cold read {} B + {} B filled ({} fills), warm read {} B of {weight_bytes} B",
            cold.bytes_read, cold.bytes_filled, cold.fills, warm.bytes_read
        );
    }
}
