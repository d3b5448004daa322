//! Turns a validated payload into an XNNPACK runtime: constants come from the named-data map
//! through the shared data cache, packed weights from the packed-weight cache.

use super::error::{at, DelegateError};
use super::payload;
use super::prepack::Prepacked;
use crate::backend::ModelContext;
use crate::cache::{BlobId, OwnedRegistration, PackedWeightsCache};
use crate::deferred::{DeferredData, Fill};
use crate::mmap::FileIdentity;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::schema::xnn as fb;
use crate::shared_cache::SharedData;
use crate::xnn::{
    AsXnnWeightsCache, BlockwiseQuantization, ChannelwiseQuantization, Datatype,
    InMemoryWeightsCache, Runtime, Subgraph, ValueRole, WeightsCache, XnnpackWeightsCache,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use zerocopy::{FromBytes, Immutable};

const XNN_FLAG_EXTERNAL_INPUT: u32 = 1;
const XNN_FLAG_EXTERNAL_OUTPUT: u32 = 2;
/// XNNPACK may read this many bytes past any tensor data.
pub(super) const EXTRA_BYTES: usize = 16;

self_cell::self_cell!(
    /// A delegate's runtime together with everything its subgraph borrowed (the payload, the
    /// loaded constants and scales, the weights cache), so it can be stored and moved freely:
    /// the runtime borrows from the owner, which lives at a fixed heap address and is dropped
    /// after it.
    pub(crate) struct OwnedRuntime {
        owner: Keep,
        #[covariant]
        dependent: Runtime,
    }
);

/// Everything a delegate's runtime borrows: owned here so the runtime can live in a handle.
pub(crate) struct Keep {
    payload: DataBuffer,
    /// Filled once, while the graph is built (the payload is parsed and verified once).
    loaded: std::sync::OnceLock<Loaded>,
    cache: Weights,
}

/// The constants and scales the runtime borrows.
pub(super) struct Loaded {
    /// By constant_data index (0 is "no constant").
    constants: Vec<Option<Constant>>,
    /// Scales by value index: where they sit in a constant, or a typed copy.
    scales: HashMap<usize, Scales>,
    /// Placeholders some operator reads as they are: read in before runtime creation and held
    /// readable for as long as the runtime lives.
    pinned: parking_lot::Mutex<Vec<Arc<DeferredData>>>,
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.pinned.get_mut().iter().for_each(|d| d.unpin());
    }
}

/// A constant's bytes: shared through the backend's cache, or a copy (inline in the payload,
/// or padded when the source had no room for XNNPACK's over-read; the shared entry is held too,
/// so other delegates still find it).
enum Constant {
    Shared(SharedData),
    Copied(DataBuffer, Option<SharedData>),
    /// Not read: a placeholder standing for the named constant `key` (a content key), read in
    /// only if XNNPACK needs its bytes (see [`crate::deferred`]).
    Deferred {
        key: String,
        data: Arc<DeferredData>,
    },
}

impl Constant {
    /// The bytes, unless the constant is deferred.
    fn buffer(&self) -> Option<&DataBuffer> {
        match self {
            Constant::Shared(s) => Some(s.buffer()),
            Constant::Copied(b, _) => Some(b),
            Constant::Deferred { .. } => None,
        }
    }
}

/// How a placeholder's bytes are read in: straight into it, from the delegate's map.
fn fill_from(map: Arc<dyn NamedDataMap>, key: String) -> Arc<Fill> {
    Arc::new(move |bytes: &mut [u8]| {
        map.load_data_into(&key, bytes)
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
    })
}

enum Scales {
    F32(ScaleValues<f32>),
    Bf16(ScaleValues<u16>),
}

/// A quantized value's scales: read in place from constant `.0` when its bytes are aligned for
/// the type (XNNPACK reads every scale at each launch; a copy would touch them twice more), else
/// a typed copy.
enum ScaleValues<T> {
    InConstant(usize),
    Copied(Vec<T>),
}

impl<T: FromBytes + Immutable> ScaleValues<T> {
    /// In place when `bytes` (constant `index`'s) can be read as `[T]` as they are: aligned,
    /// whole, and little-endian like the file.
    fn of_constant(index: usize, bytes: &[u8], decode: impl Fn(&[u8]) -> Vec<T>) -> Self {
        if cfg!(target_endian = "little") && <[T]>::ref_from_bytes(bytes).is_ok() {
            ScaleValues::InConstant(index)
        } else {
            ScaleValues::Copied(decode(bytes))
        }
    }
}

impl Loaded {
    fn scale_values<'a, T: FromBytes + Immutable>(
        &'a self,
        values: &'a ScaleValues<T>,
    ) -> Option<&'a [T]> {
        match values {
            ScaleValues::Copied(v) => Some(v),
            ScaleValues::InConstant(index) => {
                let bytes = self.constants.get(*index)?.as_ref()?.buffer()?.data();
                <[T]>::ref_from_bytes(bytes).ok()
            }
        }
    }

    /// Value `value`'s fp32 scales (per channel).
    fn f32_scales(&self, value: usize) -> Option<&[f32]> {
        match self.scales.get(&value)? {
            Scales::F32(s) => self.scale_values(s),
            Scales::Bf16(_) => None,
        }
    }

    /// Value `value`'s bf16 scales (per block).
    fn bf16_scales(&self, value: usize) -> Option<&[u16]> {
        match self.scales.get(&value)? {
            Scales::Bf16(s) => self.scale_values(s),
            Scales::F32(_) => None,
        }
    }
}

/// The weights cache a delegate's runtime uses.
#[derive(Clone, Default)]
pub enum Weights {
    /// None: XNNPACK packs every weight privately.
    #[default]
    None,
    /// xnnblob's packed-weight cache (persistent or in memory).
    Packed(Arc<PackedWeightsCache>),
    /// XNNPACK's own in-memory cache.
    Xnnpack(Arc<XnnpackWeightsCache>),
    /// A pointer-keyed in-memory provider (a benchmark's floor: every look-up hits once it
    /// holds the weights of the same buffers).
    Provider(Arc<WeightsCache<InMemoryWeightsCache>>),
}

impl Weights {
    fn as_xnn(&self) -> Option<&dyn AsXnnWeightsCache> {
        match self {
            Weights::None => None,
            Weights::Packed(c) => Some(&**c),
            Weights::Xnnpack(c) => Some(&**c),
            Weights::Provider(c) => Some(&**c),
        }
    }

    /// Enables setup (and saves, for the packed-weight cache).
    fn finalize(&self) -> Result<(), DelegateError> {
        match self {
            Weights::None => Ok(()),
            Weights::Packed(c) => c.finalize().map_err(DelegateError::Cache),
            Weights::Xnnpack(c) => c.finalize().map_err(at(|| "weights cache".to_string())),
            Weights::Provider(c) => {
                c.finalize();
                Ok(())
            }
        }
    }
}

/// Where `init`'s time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InitTimings {
    /// Validating the payload and loading (mapping) its constants.
    pub load: std::time::Duration,
    /// Packing, on the backend's threads, the weights the cache did not hold yet (see
    /// [`prepack`](super::prepack)).
    pub prepack: std::time::Duration,
    /// Building the subgraph and creating the XNNPACK runtime (packing, or finding packed).
    pub create: std::time::Duration,
    /// What packing ahead of creation did.
    pub prepacked: Prepacked,
    /// Weights XNNPACK packed inside the runtime's creation (0 when packing ahead found them
    /// all, or when every weight was in the cache).
    pub packed_at_creation: usize,
    /// Finalizing the weights cache (a background save starts here).
    pub finalize: std::time::Duration,
}

pub(crate) fn datatype(raw: fb::XNNDatatype, value: usize) -> Result<Datatype, DelegateError> {
    Ok(match raw {
        fb::XNNDatatype::xnn_datatype_fp32 => Datatype::Fp32,
        fb::XNNDatatype::xnn_datatype_fp16 => Datatype::Fp16,
        fb::XNNDatatype::xnn_datatype_bf16 => Datatype::Bf16,
        fb::XNNDatatype::xnn_datatype_int32 => Datatype::Int32,
        fb::XNNDatatype::xnn_datatype_qint8 => Datatype::Qint8,
        fb::XNNDatatype::xnn_datatype_quint8 => Datatype::Quint8,
        fb::XNNDatatype::xnn_datatype_qint32 => Datatype::Qint32,
        fb::XNNDatatype::xnn_datatype_qcint8 => Datatype::Qcint8,
        fb::XNNDatatype::xnn_datatype_qcint32 => Datatype::Qcint32,
        fb::XNNDatatype::xnn_datatype_qcint4 => Datatype::Qcint4,
        fb::XNNDatatype::xnn_datatype_qdint8 => Datatype::Qdint8,
        fb::XNNDatatype::xnn_datatype_qbint4 => Datatype::Qbint4,
        other => {
            return Err(DelegateError::UnsupportedDatatype {
                value,
                datatype: other.0,
            })
        }
    })
}

/// The tensor part of a value, and its quantization if any.
pub(crate) fn tensor_of(
    v: fb::XValue<'_>,
    index: usize,
) -> Result<
    (
        fb::XNNTensorValue<'_>,
        Option<fb::XNNQuantizedTensorValue<'_>>,
    ),
    DelegateError,
> {
    if let Some(t) = v.xvalue_union_as_xnntensor_value() {
        return Ok((t, None));
    }
    if let Some(q) = v.xvalue_union_as_xnnquantized_tensor_value() {
        let t = q.tensor_value().ok_or_else(|| {
            DelegateError::BadGraph(format!("value {index}: quantized value without a tensor"))
        })?;
        return Ok((t, Some(q)));
    }
    Err(DelegateError::BadGraph(format!(
        "value {index}: unknown value kind {}",
        v.xvalue_union_type().0
    )))
}

fn constant_index(t: &fb::XNNTensorValue<'_>) -> usize {
    t.constant_buffer_idx() as usize
}

/// The constants (by constant_data index, with their byte length) that may stand behind a
/// placeholder: named by content (so identified without reading them), read by XNNPACK only to
/// pack them, and not the scales of a quantized value.
fn deferrable_constants(graph: &fb::XNNGraph<'_>) -> Result<HashMap<usize, usize>, DelegateError> {
    let packed = super::operators::packed_operands(graph);
    let mut deferrable = HashMap::new();
    let mut scales = Vec::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, q) = tensor_of(v, i)?;
        if let Some(q) = q {
            scales.extend(
                q.quant_params_as_per_channel_quant()
                    .map(|p| p.scale_buffer_idx()),
            );
            scales.extend(
                q.quant_params_as_per_channel_group_quant()
                    .map(|p| p.scale_buffer_idx()),
            );
        }
        let index = constant_index(&t);
        if index == 0 || !packed.contains(&t.id_out()) {
            continue;
        }
        let key = graph
            .constant_data()
            .filter(|all| index < all.len())
            .and_then(|all| all.get(index).named_key())
            .unwrap_or("");
        if BlobId::from_named_key(key).is_none() {
            continue;
        }
        let Some(len) = datatype(t.datatype(), i)?.tensor_bytes(&dims_of(&t)) else {
            continue;
        };
        deferrable.insert(index, len);
    }
    for s in scales {
        deferrable.remove(&(s as usize));
    }
    Ok(deferrable)
}

/// The constants (by constant_data index) behind an operand XNNPACK packs into the weights
/// cache: a warm launch finds their packing and never reads them.
fn packed_constants(graph: &fb::XNNGraph<'_>) -> Result<HashSet<usize>, DelegateError> {
    let packed = super::operators::packed_operands(graph);
    let mut out = HashSet::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, _) = tensor_of(v, i)?;
        if packed.contains(&t.id_out()) {
            out.insert(constant_index(&t));
        }
    }
    Ok(out)
}

/// The keys `map` lists (from its index: nothing is read), gathered once per delegate: a
/// program with a thousand weights asks a thousand times.
fn listed_keys(map: &dyn NamedDataMap) -> HashSet<&str> {
    (0..map.num_keys())
        .filter_map(|i| map.key_at(i).ok())
        .collect()
}

/// Loads every constant the graph refers to, through the shared data cache; the `deferrable`
/// ones become placeholders, not read.
fn load_constants(
    graph: &fb::XNNGraph<'_>,
    payload: &DataBuffer,
    inline: &[u8],
    inline_offset: usize,
    map: &dyn NamedDataMap,
    model: &ModelContext,
    deferrable: &HashMap<usize, usize>,
) -> Result<Vec<Option<Constant>>, DelegateError> {
    let shared = model.backend().shared_data();
    let packed = packed_constants(graph)?;
    let mut out: Vec<Option<Constant>> = vec![None];
    let listed = if deferrable.is_empty() {
        Default::default()
    } else {
        listed_keys(map)
    };
    for (i, c) in graph.constant_data().iter().flatten().enumerate().skip(1) {
        let key = c.named_key().unwrap_or("");
        // Left unread only when the map lists the key (from its index: nothing is read) and,
        // where the index tells sizes, at the right size; a size it cannot tell is checked when
        // the bytes are read in. A key it does not list is loaded as usual (or found missing).
        let deferred_len = deferrable.get(&i).filter(|_| listed.contains(key));
        if let Some(&len) = deferred_len {
            if let Ok(size) = map.data_size(key) {
                if size != len {
                    return Err(DelegateError::BadGraph(format!(
                        "constant {i} ({key}): the named data holds {size} bytes, the graph \
                         needs {len}"
                    )));
                }
            }
            let data = model
                .backend()
                .deferred_constant(key, len)
                .map_err(|e| DelegateError::BadGraph(format!("constant {i}: {e}")))?;
            out.push(Some(Constant::Deferred {
                key: key.to_string(),
                data,
            }));
            continue;
        }
        let buffer = if !key.is_empty() {
            let data = shared
                .get_or_init(&shared_key(map, key), || map.get_data(key))
                .map_err(|source| DelegateError::MissingConstant {
                    key: key.to_string(),
                    source,
                })?;
            if !packed.contains(&i) {
                // XNNPACK reads this one at every launch (a depthwise filter, a scale): ask
                // for exactly its pages now, before a fault reads a window around them.
                data.buffer().read_soon();
            }
            Constant::Shared(data)
        } else {
            let (offset, size) = (c.offset(), c.size());
            let end = offset.checked_add(size);
            if end.is_none_or(|end| end > inline.len() as u64) {
                return Err(DelegateError::BadGraph(format!(
                    "constant {i}: [{offset}, +{size}) lies outside the inline constant data"
                )));
            }
            let view = payload
                .slice(inline_offset + offset as usize, size as usize)
                .ok_or_else(|| DelegateError::BadGraph(format!("constant {i}: bad range")))?;
            Constant::Copied(view, None)
        };
        // XNNPACK may read past the end of constant data: give data that sits at the very end
        // of its backing a padded copy.
        let backing = buffer.buffer().expect("not deferred");
        let constant = if backing.slack_after() < EXTRA_BYTES {
            let data = backing.data();
            let mut padded = crate::aligned::AlignedBytes::zeroed(data.len() + EXTRA_BYTES, 64)
                .ok_or_else(|| DelegateError::BadGraph("out of memory".into()))?;
            padded.as_mut_slice()[..data.len()].copy_from_slice(data);
            let len = data.len();
            let held = match buffer {
                Constant::Shared(s) => Some(s),
                Constant::Copied(_, held) => held,
                Constant::Deferred { .. } => unreachable!("handled above"),
            };
            let copy = DataBuffer::new(Arc::new(padded), 0, len).expect("inside the copy");
            Constant::Copied(copy, held)
        } else {
            buffer
        };
        out.push(Some(constant));
    }
    Ok(out)
}

/// The key a constant is shared under across the backend. ExecuTorch's exporter names constants
/// by the sha256 of their bytes, so such a key means the same bytes in every map, and is shared
/// by all of them unless the map's buffers live only as long as its program. Any other key is
/// only meaningful within its map, so it is qualified by the map's source.
fn shared_key(map: &dyn NamedDataMap, key: &str) -> String {
    let content_named = key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit());
    if content_named && !map.buffers_live_with_program() {
        key.to_string()
    } else {
        format!("{}\u{0}{key}", map.source())
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes(b.try_into().expect("2 bytes")))
        .collect()
}

/// Finds each quantized value's scales in the payload or named data.
fn load_scales(
    graph: &fb::XNNGraph<'_>,
    constants: &[Option<Constant>],
) -> Result<HashMap<usize, Scales>, DelegateError> {
    let from_constant = |index: u32, value: usize| -> Result<&[u8], DelegateError> {
        constants
            .get(index as usize)
            .and_then(|c| c.as_ref())
            .and_then(|c| c.buffer())
            .map(|b| b.data())
            .ok_or_else(|| {
                DelegateError::BadGraph(format!("value {value}: scale constant {index} missing"))
            })
    };
    let mut scales = HashMap::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let Some(q) = v.xvalue_union_as_xnnquantized_tensor_value() else {
            continue;
        };
        if let Some(p) = q.quant_params_as_per_channel_quant() {
            let index = p.scale_buffer_idx();
            let s = if index != 0 {
                ScaleValues::of_constant(index as usize, from_constant(index, i)?, f32s)
            } else {
                ScaleValues::Copied(p.scale().map(|s| s.iter().collect()).unwrap_or_default())
            };
            scales.insert(i, Scales::F32(s));
        } else if let Some(p) = q.quant_params_as_per_channel_group_quant() {
            let index = p.scale_buffer_idx();
            let s = if index != 0 {
                ScaleValues::of_constant(index as usize, from_constant(index, i)?, u16s)
            } else if let Some(bf16) = p.scale_bf16() {
                ScaleValues::Copied(bf16.iter().collect())
            } else {
                // fp32 scales given: bf16 is their upper half (XNNPACK takes bf16 here).
                ScaleValues::Copied(
                    p.scale()
                        .map(|s| s.iter().map(|f| (f.to_bits() >> 16) as u16).collect())
                        .unwrap_or_default(),
                )
            };
            scales.insert(i, Scales::Bf16(s));
        }
    }
    Ok(scales)
}

/// The named key of constant `index`, if it has one.
fn named_key<'g>(graph: &fb::XNNGraph<'g>, index: usize) -> Option<&'g str> {
    let all = graph.constant_data()?;
    (index < all.len()).then(|| all.get(index).named_key())?
}

/// A named key, the identity it claims, and the bytes it names.
type Claimed<'k> = (&'k str, BlobId, DataBuffer);

/// Checks named keys against their bytes before they are taken as identities ([`KeyTrust`]):
/// the first time an init meets a data file the cache has no check of, every key of that file
/// that states a sha256 is hashed and compared, at once, so that the file can be recorded as
/// checked whichever delegates later use which of its keys. Keys that do not match get their
/// bytes' own hash as identity.
///
/// [`KeyTrust`]: crate::cache::KeyTrust
struct KeyCheck<'a> {
    map: &'a dyn NamedDataMap,
    cache: &'a PackedWeightsCache,
    /// Threads the hashing may use.
    threads: usize,
    /// Files seen in this init, and whether they still need a check.
    files: HashMap<FileIdentity, bool>,
    /// Keys whose bytes did not match, with their bytes' hash.
    mismatched: HashMap<String, BlobId>,
}

impl<'a> KeyCheck<'a> {
    fn new(
        map: &'a dyn NamedDataMap,
        cache: &'a PackedWeightsCache,
        threads: usize,
    ) -> KeyCheck<'a> {
        KeyCheck {
            map,
            cache,
            threads: threads.max(1),
            files: HashMap::new(),
            mismatched: HashMap::new(),
        }
    }

    /// The file `key`'s bytes come from, if `key` states a sha256 and that file has no check
    /// recorded (a file checked in this init counts as checked).
    fn unchecked_file(&mut self, key: &str) -> Option<FileIdentity> {
        BlobId::from_named_key(key)?;
        let file = self.map.file_identity(key)?;
        let cache = self.cache;
        let unchecked = *self
            .files
            .entry(file)
            .or_insert_with(|| cache.must_check_keys_of(&file));
        unchecked.then_some(file)
    }

    /// Hashes every sha256-named key of `file` in the map, records what did not match, and
    /// tells the cache. A key that cannot be read is left to the load to report.
    fn check_file(&mut self, file: FileIdentity) {
        let map = self.map;
        let mut blobs: Vec<Claimed<'_>> = (0..map.num_keys())
            .filter_map(|i| {
                let key = map.key_at(i).ok()?;
                let claimed = BlobId::from_named_key(key)?;
                (map.file_identity(key) == Some(file))
                    .then(|| Some((key, claimed, map.get_data(key).ok()?)))?
            })
            .collect();
        // Largest first, each to the thread with the fewest bytes so far: the threads finish
        // together.
        blobs.sort_by_key(|(_, _, data)| std::cmp::Reverse(data.len()));
        let mut shares: Vec<(usize, Vec<&Claimed<'_>>)> = (0..self.threads.min(blobs.len()).max(1))
            .map(|_| (0, Vec::new()))
            .collect();
        for blob in &blobs {
            let share = shares
                .iter_mut()
                .min_by_key(|(bytes, _)| *bytes)
                .expect("a share");
            share.0 += blob.2.len();
            share.1.push(blob);
        }
        let hash = |share: &[&Claimed<'_>]| -> Vec<(String, BlobId)> {
            let mut differ = Vec::new();
            for (key, claimed, data) in share {
                let actual = BlobId::of_bytes(data.data());
                // Packing reads them again soon, from the page cache; until then they need
                // not count against this process's memory.
                data.release_pages();
                if actual != *claimed {
                    differ.push((key.to_string(), actual));
                }
            }
            differ
        };
        let differ: Vec<(String, BlobId)> = std::thread::scope(|scope| {
            let (first, rest) = shares.split_first().expect("a share");
            let others: Vec<_> = rest
                .iter()
                .map(|(_, share)| (share, scope.spawn(|| hash(share))))
                .collect();
            let mut all = hash(&first.1);
            for (share, other) in others {
                // Hashing does not panic; if a thread ever did, its share is hashed again here.
                all.extend(other.join().unwrap_or_else(|_| hash(share)));
            }
            all
        });
        let mismatches = differ.len();
        self.mismatched.extend(differ);
        self.files.insert(file, false);
        self.cache.keys_checked(file, mismatches);
    }

    /// The identity of the bytes named `key`, which claims `claimed`: the bytes' own hash
    /// where a check found them different.
    fn identity(&mut self, key: &str, claimed: BlobId) -> BlobId {
        if let Some(file) = self.unchecked_file(key) {
            self.check_file(file);
        }
        self.mismatched.get(key).copied().unwrap_or(claimed)
    }
}

/// The identity of a constant as packed weights are looked up by: named keys of ExecuTorch's
/// XNNPACK exporter are the sha256 of the bytes (hashed only to check a new data file's keys);
/// anything else is hashed.
fn identity(
    graph: &fb::XNNGraph<'_>,
    index: usize,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
) -> Option<BlobId> {
    let key = named_key(graph, index).unwrap_or("");
    let constant = keep.constants.get(index)?.as_ref()?;
    match BlobId::from_named_key(key) {
        Some(claimed) => Some(check.identity(key, claimed)),
        None => Some(BlobId::of_bytes(constant.buffer()?.data())),
    }
}

/// Registers the data of every constant value with the packed-weight cache, under its content
/// identity (combined with its scales' for quantized weights, whose packing includes them).
fn register_constants(
    graph: &fb::XNNGraph<'_>,
    keep: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    deferral: Option<&Arc<dyn NamedDataMap>>,
    check: &mut KeyCheck<'_>,
) -> Result<Vec<OwnedRegistration>, DelegateError> {
    let mut registrations = Vec::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, q) = tensor_of(v, i)?;
        let index = constant_index(&t);
        if index == 0 {
            continue;
        }
        let Some(mut id) = identity(graph, index, keep, check) else {
            continue;
        };
        if let Some(q) = q {
            let scale_index = q
                .quant_params_as_per_channel_quant()
                .map(|p| p.scale_buffer_idx())
                .or_else(|| {
                    q.quant_params_as_per_channel_group_quant()
                        .map(|p| p.scale_buffer_idx())
                })
                .unwrap_or(0) as usize;
            let scale_id = if scale_index != 0 {
                identity(graph, scale_index, keep, check)
            } else {
                match (keep.f32_scales(i), keep.bf16_scales(i)) {
                    (Some(s), _) => Some(BlobId::of_f32s(s)),
                    (None, Some(s)) => Some(BlobId::of_bytes(
                        &s.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
                    )),
                    (None, None) => None,
                }
            };
            if let Some(scale_id) = scale_id {
                id = BlobId::combine(&[id, scale_id]);
            }
        }
        let registration = match keep.constants[index].as_ref().expect("identity found it") {
            Constant::Deferred { key, data } => {
                let map = deferral.expect("placeholders only with a source").clone();
                cache.register_deferred(data.clone(), id, fill_from(map, key.clone()))
            }
            constant => cache.register_owned(constant.buffer().expect("not deferred").clone(), id),
        };
        registrations.push(registration);
    }
    Ok(registrations)
}

pub(super) fn dims_of(t: &fb::XNNTensorValue<'_>) -> Vec<usize> {
    t.dims()
        .map(|d| d.iter().map(|x| x as usize).collect())
        .unwrap_or_default()
}

/// Defines every value of the graph; returns the payload id -> subgraph id map.
fn define_values<'k>(
    g: &mut Subgraph<'k>,
    graph: &fb::XNNGraph<'_>,
    keep: &'k Loaded,
) -> Result<HashMap<u32, u32>, DelegateError> {
    let mut ids = HashMap::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, _) = tensor_of(v, i)?;
        let role = role_of(&t, i, keep)?;
        ids.insert(t.id_out(), define_value(g, v, i, keep, role)?);
    }
    Ok(ids)
}

/// The named key and placeholder of value `t`, if its constant is deferred.
pub(super) fn deferred_constant<'k>(
    t: &fb::XNNTensorValue<'_>,
    keep: &'k Loaded,
) -> Option<(&'k str, &'k Arc<DeferredData>)> {
    match keep.constants.get(constant_index(t))? {
        Some(Constant::Deferred { key, data }) => Some((key, data)),
        _ => None,
    }
}

/// What value `i` is in the subgraph: constant data (or its placeholder), an external input or
/// output, or internal.
pub(super) fn role_of<'k>(
    t: &fb::XNNTensorValue<'_>,
    i: usize,
    keep: &'k Loaded,
) -> Result<ValueRole<'k>, DelegateError> {
    let index = constant_index(t);
    Ok(if index != 0 {
        let c = keep
            .constants
            .get(index)
            .and_then(|c| c.as_ref())
            .ok_or_else(|| {
                DelegateError::BadGraph(format!("value {i}: constant {index} does not exist"))
            })?;
        match c {
            Constant::Deferred { data, .. } => ValueRole::Deferred(data),
            c => ValueRole::Static(c.buffer().expect("not deferred").data()),
        }
    } else if t.flags() & XNN_FLAG_EXTERNAL_INPUT != 0 {
        ValueRole::Input(t.external_id())
    } else if t.flags() & XNN_FLAG_EXTERNAL_OUTPUT != 0 {
        ValueRole::Output(t.external_id())
    } else {
        ValueRole::Internal
    })
}

/// Defines value `i` of the payload in `g` as `role`, with its datatype, shape and quantization;
/// returns its subgraph id.
pub(super) fn define_value<'k>(
    g: &mut Subgraph<'k>,
    v: fb::XValue<'_>,
    i: usize,
    keep: &'k Loaded,
    role: ValueRole<'k>,
) -> Result<u32, DelegateError> {
    let (t, q) = tensor_of(v, i)?;
    let dims = dims_of(&t);
    let dt = datatype(t.datatype(), i)?;
    let what = || format!("value {i} ({dt:?} {dims:?})");
    let Some(q) = q else {
        return g.define_tensor(dt, &dims, role).map_err(at(what));
    };
    if let Some(p) = q.quant_params_as_per_tensor_quant() {
        g.define_quantized_tensor(dt, &dims, p.zero_point(), p.scale(), role)
            .map_err(at(what))
    } else if let Some(p) = q.quant_params_as_per_token_dynamic_quant() {
        g.define_dynamically_quantized_tensor(dt, &dims, p.num_nonbatch_dims() as usize)
            .map_err(at(what))
    } else if let Some(p) = q.quant_params_as_per_channel_quant() {
        let Some(scales) = keep.f32_scales(i) else {
            return Err(DelegateError::BadGraph(format!("value {i}: no scales")));
        };
        let quantization = ChannelwiseQuantization {
            // ExecuTorch stores 4-bit weights as unsigned nibbles (value + 8).
            zero_point: if dt == Datatype::Qcint4 { 8 } else { 0 },
            scales,
            channel_dim: p.channel_dim() as usize,
        };
        g.define_channelwise_quantized_tensor(dt, &dims, quantization, role)
            .map_err(at(what))
    } else if let Some(p) = q.quant_params_as_per_channel_group_quant() {
        let Some(scales) = keep.bf16_scales(i) else {
            return Err(DelegateError::BadGraph(format!("value {i}: no scales")));
        };
        let quantization = BlockwiseQuantization {
            zero_point: 8,
            scales,
            channel_dim: p.channel_dim() as usize,
            block_size: p.group_size() as usize,
        };
        g.define_blockwise_quantized_tensor(dt, &dims, quantization, role)
            .map_err(at(what))
    } else {
        Err(DelegateError::BadGraph(format!(
            "value {i}: unknown quantization {}",
            q.quant_params_type().0
        )))
    }
}

/// Rejects unsupported nodes, and more external ids than values, before anything is loaded.
fn check_nodes(graph: &fb::XNNGraph<'_>) -> Result<(), DelegateError> {
    // XNNPACK allocates a value slot (some 200 bytes) for every external id up front: a count
    // taken on trust let a 1.5 KB payload make it allocate and zero 3 GB (found by fuzzing).
    // Each external id is held by a value of the graph, so no exporter writes more.
    let values = graph.xvalues().map_or(0, |v| v.len());
    if graph.num_externs() as usize > values {
        return Err(DelegateError::BadGraph(format!(
            "{} external ids for {values} values",
            graph.num_externs()
        )));
    }
    let mut reads: HashMap<u32, usize> = HashMap::new();
    // Each written value: its node, and how many values that node writes.
    let mut writer: HashMap<u32, (usize, usize)> = HashMap::new();
    for (n, node) in graph.xnodes().iter().flatten().enumerate() {
        let kind = node.xnode_union_type();
        let io = super::operators::find(kind).and(super::operators::node_io(&node));
        let Some((inputs, outputs)) = io else {
            return Err(DelegateError::UnsupportedNode {
                index: n,
                name: kind
                    .variant_name()
                    .map_or_else(|| format!("node type {}", kind.0), str::to_string),
            });
        };
        for i in inputs {
            *reads.entry(i).or_default() += 1;
        }
        for &output in &outputs {
            if let Some((first, _)) = writer.insert(output, (n, outputs.len())) {
                return Err(DelegateError::BadGraph(format!(
                    "value {output} is written by nodes {first} and {n}"
                )));
            }
        }
    }
    // XNNPACK drops a node whose output nothing reads, but not what fed it, and then aborts the
    // process in its fusion pass: such a graph (no exporter writes one) is refused here.
    let outputs: HashSet<u32> = graph
        .xvalues()
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, v)| tensor_of(v, i).ok())
        .filter(|(t, _)| t.flags() & XNN_FLAG_EXTERNAL_OUTPUT != 0)
        .map(|(t, _)| t.id_out())
        .collect();
    // A node of several outputs (argmax pooling's values and indices) is kept while one is used.
    let used = |value: &u32| reads.contains_key(value) || outputs.contains(value);
    for (&value, &(n, written)) in &writer {
        let node_used = written > 1 && writer.iter().any(|(v, &(m, _))| m == n && used(v));
        if !used(&value) && !node_used {
            return Err(DelegateError::BadGraph(format!(
                "node {n} writes value {value}, which no node reads and which is no output"
            )));
        }
    }
    Ok(())
}

/// What building the runtime hands back besides it.
struct Built {
    /// Registrations that must outlive runtime creation.
    registrations: Vec<OwnedRegistration>,
    /// How long loading the constants took.
    load: std::time::Duration,
    /// What packing ahead of creation did, and how long it took.
    prepacked: (Prepacked, std::time::Duration),
    /// Weights the creation itself packed.
    packed_at_creation: usize,
}

/// How many weights the packed-weight cache has packed so far (0 for other caches).
fn packs(weights: &Weights) -> usize {
    match weights {
        Weights::Packed(cache) => cache.stats().packed,
        _ => 0,
    }
}

/// Pins (reads in, for the runtime's lifetime) the placeholders of values some node reads as
/// they are.
fn pin_read_as_is(
    graph: &fb::XNNGraph<'_>,
    loaded: &Loaded,
    read_as_is: &std::collections::HashSet<u32>,
    deferral: Option<&Arc<dyn NamedDataMap>>,
) -> Result<(), DelegateError> {
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, _) = tensor_of(v, i)?;
        if !read_as_is.contains(&t.id_out()) {
            continue;
        }
        let Some(Some(Constant::Deferred { key, data })) = loaded.constants.get(constant_index(&t))
        else {
            continue;
        };
        let map = deferral.expect("placeholders only with a source").clone();
        let pinned = data.pin(&*fill_from(map, key.clone()));
        // Held (and unpinned on drop) even if the fill failed: pins must balance.
        loaded.pinned.lock().push(data.clone());
        pinned.map_err(|source| DelegateError::UnreadConstant {
            key: key.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The first placeholder of this delegate that XNNPACK needed but could not be read in.
fn failed_fill(loaded: &Loaded) -> Option<DelegateError> {
    loaded.constants.iter().flatten().find_map(|c| match c {
        Constant::Deferred { key, data } => {
            data.fill_error().map(|why| DelegateError::UnreadConstant {
                key: key.clone(),
                source: why.into(),
            })
        }
        _ => None,
    })
}

/// Validates the payload (once), loads its constants through the backend's shared data cache,
/// builds and creates the runtime with the model's weights cache, workspace and thread pool.
///
/// With `deferral` (the same map, shared) and a packed-weight cache, constants XNNPACK reads only
/// to pack them, named by content, are not read at all: a warm launch finds their packing by
/// key, and a miss reads them from `deferral` then (see [`crate::deferred`]).
pub(crate) fn compile(
    payload_bytes: DataBuffer,
    map: &dyn NamedDataMap,
    deferral: Option<Arc<dyn NamedDataMap>>,
    model: &ModelContext,
) -> Result<(OwnedRuntime, InitTimings), DelegateError> {
    let keep = Keep {
        payload: payload_bytes,
        loaded: std::sync::OnceLock::new(),
        cache: model.weights().clone(),
    };
    let deferral = deferral.filter(|_| matches!(model.weights(), Weights::Packed(_)));
    let started = std::time::Instant::now();
    // What the builder hands out besides the runtime: registrations that must live while the
    // runtime is created, and the time constants took.
    let mut built: Option<Built> = None;
    let runtime = OwnedRuntime::try_new(keep, |k| -> Result<Runtime<'_>, DelegateError> {
        let p = payload::parse(&k.payload)?;
        check_nodes(&p.graph)?;
        let mut deferrable = match deferral {
            Some(_) => deferrable_constants(&p.graph)?,
            None => HashMap::new(),
        };
        let mut check = match &k.cache {
            Weights::Packed(cache) => Some(KeyCheck::new(map, cache, model.threads())),
            _ => None,
        };
        if let Some(check) = &mut check {
            // A key whose check finds another identity is packed from its bytes; the check
            // comes first, so that placeholders are made only for keys that matched.
            deferrable.retain(|&i, _| {
                named_key(&p.graph, i).is_none_or(|key| {
                    BlobId::from_named_key(key)
                        .is_none_or(|claimed| check.identity(key, claimed) == claimed)
                })
            });
        }
        let constants = load_constants(
            &p.graph,
            &k.payload,
            p.constant_data,
            p.header.constant_data_offset as usize,
            map,
            model,
            &deferrable,
        )?;
        let scales = load_scales(&p.graph, &constants)?;
        let loaded = k.loaded.get_or_init(|| Loaded {
            constants,
            scales,
            pinned: parking_lot::Mutex::new(Vec::new()),
        });
        let load_time = started.elapsed();
        let registrations = match (&k.cache, &mut check) {
            (Weights::Packed(cache), Some(check)) => {
                register_constants(&p.graph, loaded, cache, deferral.as_ref(), check)?
            }
            _ => Vec::new(),
        };
        let mut g = Subgraph::new(p.graph.num_externs()).map_err(at(|| "subgraph".into()))?;
        let ids = define_values(&mut g, &p.graph, loaded)?;
        let read_as_is = super::operators::define_nodes(&mut g, &p.graph, &ids)?;
        pin_read_as_is(&p.graph, loaded, &read_as_is, deferral.as_ref())?;
        let prepacked = match &k.cache {
            Weights::Packed(cache) if model.prepack() => {
                let started = std::time::Instant::now();
                let done = super::prepack::prepack(
                    &p.graph,
                    loaded,
                    cache,
                    deferral.as_deref(),
                    model.threads(),
                )?;
                (done, started.elapsed())
            }
            _ => Default::default(),
        };
        let packs_before = packs(&k.cache);
        let runtime = Runtime::with_options(&g, k.cache.as_xnn(), model.runtime_options())?;
        built = Some(Built {
            registrations,
            load: load_time,
            prepacked,
            packed_at_creation: packs(&k.cache) - packs_before,
        });
        Ok(runtime)
    })?;
    let built = built.expect("set when the runtime was made");
    drop(built.registrations);
    let load_time = built.load;
    if let Some(error) = runtime.borrow_owner().loaded.get().and_then(failed_fill) {
        return Err(error);
    }
    let mut timings = InitTimings {
        load: load_time,
        prepack: built.prepacked.1,
        create: started.elapsed() - load_time - built.prepacked.1,
        prepacked: built.prepacked.0,
        packed_at_creation: built.packed_at_creation,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    runtime.borrow_owner().cache.finalize()?;
    timings.finalize = started.elapsed();
    Ok((runtime, timings))
}
