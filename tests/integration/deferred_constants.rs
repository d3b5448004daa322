//! Placeholder constants (`XnnDelegate::init_deferred`): a warm launch reads no weight byte from
//! the named-data map, whatever the map does on a read, and runs to the same outputs as the cold
//! launch that read and packed them.

use crate::common;

use common::{dir, f32s};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use xnnblob::backend::{Backend, WeightsCacheChoice};
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
        .model(Some(&WeightsCacheChoice::File(cache.to_path_buf())))
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
    let fixtures = [
        ("mlp_xnn_external", "mlp.input.f32", true),
        ("mlp_qd8_qc8w_external", "mlp_qd8.input.f32", true),
        ("cnn_xnn_external", "cnn.input.f32", false),
    ];
    for (i, (name, input, mostly_filters)) in fixtures.into_iter().enumerate() {
        let dir = common::scratch("deferred");
        let cache = dir.join(format!("{name}.xbc"));
        let (_, _, weight_bytes) = open(name);
        // Into a cache file that held nothing, a program this small reads its weights as they
        // are and its runtime's creation packs them: no placeholder is read in.
        let first = launch(name, input, &dir.join(format!("{name}.empty.xbc")));
        assert!(first.packed > 0, "{name}: the first launch packs");
        assert_eq!((first.fills, first.bytes_filled), (0, 0), "{name}");
        if mostly_filters {
            assert!(
                first.bytes_read * 2 > weight_bytes,
                "{name}: weights read as they are"
            );
        }
        // Into one that holds another program's weights, placeholders: read in only to pack.
        let (other, other_input, _) = fixtures[(i + 1) % fixtures.len()];
        launch(other, other_input, &cache);

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
        assert_eq!(
            first.output.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            cold.output.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{name}: packed in creation or ahead, the same outputs"
        );
        eprintln!(
            "{name}: cold read {} B + {} B filled ({} fills), warm read {} B of {weight_bytes} B",
            cold.bytes_read, cold.bytes_filled, cold.fills, warm.bytes_read
        );
    }
}

/// One fp16 launch of `graph` through placeholders, with a cache file: the output's bits and
/// what was read and packed.
fn launch_f16(
    graph: &xnnblob_test_support::builder::BuiltGraph,
    input: &[u16],
    output_len: usize,
    cache: &std::path::Path,
) -> (Vec<u16>, Launch, bool) {
    use xnnblob::tensor::{DType, Shape, TensorMut, TensorRef};
    let map = Arc::new(Counting {
        inner: MergedMap::new(vec![Arc::new(graph.map("weights").unwrap())]).unwrap(),
        bytes_read: AtomicUsize::new(0),
        bytes_filled: AtomicUsize::new(0),
    });
    let mut payload = InMemoryMap::new("payload");
    payload.insert("p", &graph.payload, 64, None).unwrap();
    let backend = Backend::with_defaults().unwrap();
    let model = backend
        .model(Some(&WeightsCacheChoice::File(cache.to_path_buf())))
        .unwrap();
    let mut d = XnnDelegate::init_deferred(&model, payload.get_data("p").unwrap(), map.clone())
        .unwrap_or_else(|e| panic!("fp16 graph: {e}"));
    let bytes: Vec<u8> = input.iter().flat_map(|b| b.to_le_bytes()).collect();
    let shape = Shape::new(&d.input_shapes()[0]).unwrap();
    let mut out = vec![0u8; output_len * 2];
    d.execute(
        &[TensorRef::new(DType::F16, shape, &bytes)],
        &mut [TensorMut::new(DType::F16, &mut out)],
    )
    .unwrap();
    let stats = model.packed_cache().unwrap().stats();
    model.packed_cache().unwrap().wait_saved().unwrap();
    let output = out
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let launch = Launch {
        output: Vec::new(),
        bytes_read: map.bytes_read.load(Ordering::Relaxed),
        bytes_filled: map.bytes_filled.load(Ordering::Relaxed),
        fills: stats.deferred_fills,
        packed: stats.packed,
    };
    (output, launch, d.computes_fp16_as_fp32())
}

/// fp16 fully connected weights behind placeholders. Where XNNPACK has no fp16 GEMMs (an Armv8.0
/// core) the placeholder stands for the weights converted to fp32, is filled (read and
/// converted) only when the cache misses, and is found by an identity derived from the fp16
/// key; elsewhere the fp16 weights are packed as they are. Either way the warm launch reads no
/// weight byte, packs nothing, and gives the cold launch's outputs.
#[test]
fn fp16_weights_behind_placeholders_are_read_only_by_the_cold_launch() {
    let (m, k, n) = (3usize, 24usize, 16usize);
    // Eighths in [-1, 1]: exact in fp16, so the reference sees the weights XNNPACK sees.
    let value = |i: usize, seed: usize| ((i * 7 + seed) % 17) as f32 / 8.0 - 1.0;
    let x: Vec<f32> = (0..m * k).map(|i| value(i, 1)).collect();
    let w: Vec<f32> = (0..n * k).map(|i| value(i, 5)).collect();
    let bias: Vec<f32> = (0..n).map(|i| value(i, 3)).collect();
    let half = |v: &[f32]| {
        v.iter()
            .map(|&v| common::half::to_f16(v))
            .collect::<Vec<u16>>()
    };
    let mut b = xnnblob_test_support::builder::GraphBuilder::new();
    let input = b.input_f16(&[m as u32, k as u32]);
    let filter = b.constant_f16(&[n as u32, k as u32], &half(&w));
    let bias_value = b.constant_f16(&[n as u32], &half(&bias));
    let out = b.fully_connected(
        input,
        filter,
        Some(bias_value),
        f32::NEG_INFINITY,
        f32::INFINITY,
    );
    b.output(out);
    let graph = b.finish();

    let dir = common::scratch("deferred-fp16");
    // Into a cache file that held nothing, a graph this small is packed in its runtime's
    // creation: no placeholder, none filled.
    let empty = dir.join("fp16.empty.xbc");
    let _ = std::fs::remove_file(&empty);
    let (first_out, first, _) = launch_f16(&graph, &half(&x), m * n, &empty);
    assert!(first.packed > 0, "the first launch packs");
    assert_eq!((first.fills, first.bytes_filled), (0, 0));
    // Into one that holds another program's weights, its filter is a placeholder.
    let cache = dir.join("fp16.xbc");
    let _ = std::fs::remove_file(&cache);
    launch("mlp_xnn_external", "mlp.input.f32", &cache);
    let (cold_out, cold, as_fp32) = launch_f16(&graph, &half(&x), m * n, &cache);
    let (warm_out, warm, _) = launch_f16(&graph, &half(&x), m * n, &cache);

    let reference: Vec<f32> = (0..m * n)
        .map(|o| {
            let (r, c) = (o / n, o % n);
            bias[c] + (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum::<f32>()
        })
        .collect();
    let got: Vec<f32> = cold_out
        .iter()
        .map(|&b| xnnblob::tensor::f16_to_f32(b))
        .collect();
    let worst = common::close::relative_difference(&got, &reference);
    eprintln!(
        "fp16 weights behind placeholders (fp16 computed as fp32: {as_fp32}): cold read {} B + \
         {} B filled ({} fills, {} packed), warm read {} B, filled {} B; {worst:e} of the range \
         from the plain reference",
        cold.bytes_read,
        cold.bytes_filled,
        cold.fills,
        cold.packed,
        warm.bytes_read,
        warm.bytes_filled
    );
    // A few fp16 ulp of the output range (fp16 kernels round partial sums to fp16).
    assert!(worst <= 4e-3, "{worst}");
    assert!(cold.packed > 0, "the cold launch packs");
    // The cold launch reads the filter's fp16 bytes: packing ahead may take them from the map
    // as they are, but a converted placeholder is filled, converting them.
    assert!(cold.bytes_read + cold.bytes_filled >= n * k * 2);
    if as_fp32 {
        assert_eq!(cold.fills, 1, "the converted filter is read in once");
        assert_eq!(cold.bytes_filled, n * k * 2);
    }
    assert_eq!(warm.packed, 0, "the warm launch packs nothing");
    assert_eq!(warm.fills, 0, "no placeholder was read in");
    assert_eq!(warm.bytes_filled, 0);
    // Only the bias, read as it is at every launch.
    assert_eq!(warm.bytes_read, n * 2);
    assert_eq!(warm_out, cold_out, "warm and cold outputs are identical");
    assert_eq!(
        first_out, cold_out,
        "packed in creation or ahead, the same outputs"
    );
}

/// A delegate lets go of its payload once its runtime is made (XNNPACK copies the graph into
/// it), as ExecuTorch's own backend frees `processed` after init: ExecuTorch's mmap loader maps
/// each payload apart, so holding them kept two pages per delegate resident for the life of the
/// program (400 KiB for a 62-delegate decoder).
#[test]
fn a_delegate_lets_go_of_its_payload_once_its_runtime_is_made() {
    use xnnblob::aligned::AlignedBytes;
    use xnnblob::named_data::Backing;
    let (name, input) = ("mlp_xnn_external", "mlp.input.f32");
    let dir = common::scratch("payload-let-go");
    let expected = launch(name, input, &dir.join("first.xbc")).output;
    let backend = Backend::with_defaults().unwrap();
    for (deferred, cache) in [
        (false, None),
        (true, Some(WeightsCacheChoice::File(dir.join("cold.xbc")))),
        (true, Some(WeightsCacheChoice::File(dir.join("cold.xbc")))),
    ] {
        let (payload, map, _) = open(name);
        let backing: Arc<dyn Backing> = Arc::new(AlignedBytes::copy_from(&payload, 64).unwrap());
        let held = Arc::downgrade(&backing);
        let payload = DataBuffer::new(backing, 0, payload.len()).unwrap();
        let model = backend.model(cache.as_ref()).unwrap();
        let mut d = if deferred {
            XnnDelegate::init_deferred(&model, payload, map.clone())
        } else {
            XnnDelegate::init(&model, payload, &*map)
        }
        .unwrap();
        assert!(
            held.upgrade().is_none(),
            "deferred {deferred}, cache {cache:?}: the payload outlived init"
        );
        let mut output = vec![f32::NAN; expected.len()];
        d.execute_f32(&[&f32s(&common::dir().join(input))], &mut [&mut output])
            .unwrap();
        assert_eq!(
            output.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "deferred {deferred}, cache {cache:?}"
        );
        if let Some(c) = model.packed_cache() {
            c.wait_saved().unwrap();
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
