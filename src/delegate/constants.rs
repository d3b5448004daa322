//! A delegate's constants: read from the payload or named data (through the backend's shared
//! data cache), left unread as placeholders when only their packed form is needed, and the
//! scales quantized values borrow from them.

use super::error::DelegateError;
use super::graph::{ById, TensorView, Values, constant_index, datatype, dims_of};
use crate::backend::ModelContext;
use crate::cache::BlobId;
use crate::deferred::{DeferredData, Fill};
use crate::fast_hash::{FastMap, FastSet};
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::schema::xnn as fb;
use crate::shared_data::SharedData;
use crate::tensor::XNN_EXTRA_BYTES;
use std::sync::Arc;
use zerocopy::{FromBytes, Immutable};

/// The constants and scales the runtime borrows.
pub(super) struct Loaded {
    pub(super) constants: Constants,
    /// Scales by value index: where they sit in a constant, or a typed copy.
    pub(super) scales: ByValue<Scales>,
    /// Placeholders some operator reads as they are: read in before runtime creation and held
    /// readable for as long as the runtime lives.
    pub(super) pinned: parking_lot::Mutex<Vec<Arc<DeferredData>>>,
    /// fp16 values are defined as fp32, their constants converted (see [`super::fallback`]).
    pub(super) fp16_as_fp32: bool,
    /// Values given an address of their own instead of their constant's, by ascending value
    /// index (see [`super::weight_identities::register_constants`]); set once, when they are registered.
    /// A sorted list: most delegates have none, and an empty hash map took 40 bytes in each.
    pub(super) private: std::sync::OnceLock<ByValue<Private>>,
}

/// Entries by value index, in a list sorted by it: a delegate has a few (its scales, its
/// values' own placeholders), where a hash map took four slots and a control block even for one.
pub(super) struct ByValue<T>(Box<[(usize, T)]>);

impl<T> ByValue<T> {
    /// From entries pushed in ascending value index, as a walk over the graph's values makes them.
    pub(super) fn from_ascending(entries: Vec<(usize, T)>) -> ByValue<T> {
        debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0));
        ByValue(entries.into_boxed_slice())
    }

    /// Value `value`'s entry, if it has one.
    pub(super) fn get(&self, value: usize) -> Option<&T> {
        let at = self.0.binary_search_by_key(&value, |(v, _)| *v).ok()?;
        Some(&self.0[at].1)
    }
}

/// A constant value's address of its own, where it could not share its constant's (see
/// [`super::weight_identities::register_constants`]).
pub(super) enum Private {
    /// A placeholder, with how it is read in.
    Placeholder {
        data: Arc<DeferredData>,
        fill: Arc<Fill>,
    },
    /// A copy of a small constant that was in memory.
    Copy(DataBuffer),
}

impl Loaded {
    /// Value `i`'s own placeholder, if it has one.
    pub(super) fn private(&self, i: usize) -> Option<&Private> {
        self.private.get()?.get(i)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.pinned.get_mut().iter().for_each(|d| d.unpin());
    }
}

/// A constant's bytes: shared through the backend's cache, or a copy (inline in the payload,
/// or padded when the source had no room for XNNPACK's over-read; the shared entry is held too,
/// so other delegates still find it).
pub(super) enum Constant {
    Shared(SharedData),
    Copied(DataBuffer, Option<SharedData>),
    /// Read from the packed-weight cache's entry that keeps it (see
    /// [`KEPT_CONSTANT_SEED`](crate::cache::format::KEPT_CONSTANT_SEED)): the cache file's
    /// mapping is shared by every delegate of the backend.
    Kept(DataBuffer),
    /// Not read: a placeholder standing for the named constant `key` (a content key), read in
    /// only if XNNPACK needs its bytes (see [`crate::deferred`]). With a `conversion`, the
    /// placeholder stands for `key`'s bytes converted (and is that size).
    Deferred {
        /// Shared with the backend's table of placeholders (one copy of the key).
        key: Arc<str>,
        data: Arc<DeferredData>,
        conversion: Option<Conversion>,
    },
    /// `source`'s bytes converted into another datatype, in a padded copy of their own: what
    /// XNNPACK is given where it has no kernels for the graph's own datatype (see
    /// [`super::fallback`]). The source is held for its identity and its shared entry.
    Converted {
        source: Box<Constant>,
        data: DataBuffer,
        conversion: Conversion,
    },
}

/// A delegate's constants by constant_data index. Index 0 means "no constant" and is not stored:
/// an empty entry per delegate was 3 KB of a decoder's load.
pub(super) struct Constants(Box<[Constant]>);

impl Constants {
    /// Constant `index`; None for 0 and past the end.
    pub(super) fn get(&self, index: usize) -> Option<&Constant> {
        self.0.get(index.checked_sub(1)?)
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, Constant> {
        self.0.iter()
    }
}

impl Constant {
    /// The bytes XNNPACK is given, unless the constant is deferred.
    pub(super) fn buffer(&self) -> Option<&DataBuffer> {
        match self {
            Constant::Shared(s) => Some(s.buffer()),
            Constant::Copied(b, _) | Constant::Kept(b) => Some(b),
            Constant::Converted { data, .. } => Some(data),
            Constant::Deferred { .. } => None,
        }
    }
}

/// A conversion of constant data into the datatype XNNPACK computes in instead of the graph's
/// own (see [`super::fallback`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conversion {
    /// fp16 to fp32, little-endian both: exact (every fp16 is an fp32).
    F16ToF32,
}

impl Conversion {
    /// Its name in the identities of converted data ([`BlobId::converted`]): changing it
    /// changes every such identity.
    pub(super) fn name(self) -> &'static str {
        match self {
            Conversion::F16ToF32 => "f16->f32",
        }
    }

    /// The length of `source_len` bytes converted.
    pub(super) fn output_len(self, source_len: usize) -> usize {
        match self {
            Conversion::F16ToF32 => source_len * 2,
        }
    }

    /// The length of the source of `output_len` converted bytes.
    fn source_len(self, output_len: usize) -> usize {
        match self {
            Conversion::F16ToF32 => output_len / 2,
        }
    }

    /// Converts `source` into `out` ([`output_len`](Self::output_len) of it long).
    pub(super) fn apply(self, source: &[u8], out: &mut [u8]) {
        match self {
            Conversion::F16ToF32 => {
                for (o, i) in out.chunks_exact_mut(4).zip(source.chunks_exact(2)) {
                    let bits = u16::from_le_bytes([i[0], i[1]]);
                    o.copy_from_slice(&crate::tensor::f16_to_f32(bits).to_le_bytes());
                }
            }
        }
    }

    /// `source` converted, in a buffer with XNNPACK's over-read room after it.
    fn convert(self, source: &[u8], what: usize) -> Result<DataBuffer, DelegateError> {
        let len = self.output_len(source.len());
        let mut out =
            crate::aligned::AlignedBytes::zeroed(len + XNN_EXTRA_BYTES, 64).ok_or_else(|| {
                DelegateError::OutOfMemory {
                    what: format!("constant {what} converted {}", self.name()),
                    bytes: len + XNN_EXTRA_BYTES,
                }
            })?;
        self.apply(source, &mut out.as_mut_slice()[..len]);
        Ok(DataBuffer::new(Arc::new(out), 0, len).expect("inside the copy"))
    }
}

/// How a placeholder's bytes are read in: straight into it from the delegate's map or, with a
/// `conversion`, read from the map and converted into it.
pub(super) fn fill_from(
    map: Arc<dyn NamedDataMap>,
    key: Arc<str>,
    conversion: Option<Conversion>,
) -> Arc<Fill> {
    let boxed = |e: crate::named_data::NamedDataError| {
        Box::new(e) as Box<dyn std::error::Error + Send + Sync>
    };
    match conversion {
        None => Arc::new(move |bytes: &mut [u8]| map.load_data_into(&key, bytes).map_err(boxed)),
        Some(conversion) => Arc::new(move |bytes: &mut [u8]| {
            // Read only on a cache miss, and released as soon as it is converted.
            let mut source = vec![0u8; conversion.source_len(bytes.len())];
            map.load_data_into(&key, &mut source).map_err(boxed)?;
            conversion.apply(&source, bytes);
            Ok(())
        }),
    }
}

pub(super) enum Scales {
    F32(ScaleValues<f32>),
    Bf16(ScaleValues<u16>),
}

/// A quantized value's scales: read in place from constant `.0` when its bytes are aligned for
/// the type (XNNPACK reads every scale at each launch; a copy would touch them twice more), else
/// a typed copy.
pub(super) enum ScaleValues<T> {
    InConstant(usize),
    Copied(Vec<T>),
    /// Behind constant `.0`'s placeholder: a blockwise filter's scales, read only to pack it.
    Deferred(usize),
}

/// What XNNPACK reads only to pack a value, never at a launch that finds its packing: a
/// blockwise filter's scales (XNNPACK patch 0007).
pub(super) enum ReadToPack {
    /// In memory: their pages are released once the value is packed.
    InMemory(DataBuffer),
    /// Behind a placeholder, read in (with `fill`) when the value is packed.
    Deferred(Arc<DeferredData>, Arc<Fill>),
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
    /// The content key and placeholder of value `value`'s blockwise scales, where they wait
    /// behind one (see [`ScaleValues::Deferred`]).
    pub(super) fn deferred_scales(&self, value: usize) -> Option<(&str, &Arc<DeferredData>)> {
        let Scales::Bf16(ScaleValues::Deferred(index)) = self.scales.get(value)? else {
            return None;
        };
        self.deferred_at(*index)
    }

    /// The named key and placeholder of constant `index`, if it is deferred and stands for the
    /// key's bytes as they are (not converted).
    fn deferred_at(&self, index: usize) -> Option<(&str, &Arc<DeferredData>)> {
        match self.constants.get(index)? {
            Constant::Deferred {
                key,
                data,
                conversion: None,
            } => Some((&**key, data)),
            _ => None,
        }
    }

    /// What XNNPACK reads only to pack value `value`, besides its own bytes (see
    /// [`ReadToPack`]); `deferral` reads placeholders in.
    pub(super) fn read_only_to_pack(
        &self,
        value: usize,
        deferral: Option<&Arc<dyn NamedDataMap>>,
    ) -> Option<ReadToPack> {
        match self.scales.get(value)? {
            Scales::Bf16(ScaleValues::InConstant(index)) => Some(ReadToPack::InMemory(
                self.constants.get(*index)?.buffer()?.clone(),
            )),
            Scales::Bf16(ScaleValues::Deferred(index)) => match self.constants.get(*index)? {
                Constant::Deferred {
                    key,
                    data,
                    conversion: None,
                } => Some(ReadToPack::Deferred(
                    data.clone(),
                    fill_from(deferral?.clone(), key.clone(), None),
                )),
                _ => None,
            },
            _ => None,
        }
    }

    fn scale_values<'a, T: FromBytes + Immutable>(
        &'a self,
        values: &'a ScaleValues<T>,
    ) -> Option<&'a [T]> {
        match values {
            ScaleValues::Copied(v) => Some(v),
            ScaleValues::Deferred(_) => None,
            ScaleValues::InConstant(index) => {
                let bytes = self.constants.get(*index)?.buffer()?.data();
                <[T]>::ref_from_bytes(bytes).ok()
            }
        }
    }

    /// Value `value`'s fp32 scales (per channel).
    pub(super) fn f32_scales(&self, value: usize) -> Option<&[f32]> {
        match self.scales.get(value)? {
            Scales::F32(s) => self.scale_values(s),
            Scales::Bf16(_) => None,
        }
    }

    /// Value `value`'s bf16 scales (per block): in memory, or behind a placeholder.
    pub(super) fn bf16_scales(&self, value: usize) -> Option<crate::xnn::BlockwiseScales<'_>> {
        use crate::xnn::BlockwiseScales;
        match self.scales.get(value)? {
            Scales::Bf16(ScaleValues::Deferred(index)) => match self.constants.get(*index)? {
                Constant::Deferred {
                    data,
                    conversion: None,
                    ..
                } => Some(BlockwiseScales::Deferred(data)),
                _ => None,
            },
            Scales::Bf16(s) => self.scale_values(s).map(BlockwiseScales::InMemory),
            Scales::F32(_) => None,
        }
    }
}

/// The constants (by constant_data index, with their byte length) that may stand behind a
/// placeholder: named by content (so identified without reading them), read by XNNPACK only to
/// pack them, and not the scales of a quantized value.
/// `packed`: the graph's [`packed_operands`](super::operators::packed_operands).
pub(super) fn deferrable_constants(
    values: &Values<'_>,
    packed: &FastSet<u32>,
) -> Result<FastMap<usize, usize>, DelegateError> {
    let mut deferrable = FastMap::default();
    let mut scales = Vec::new();
    let mut blockwise_scales = Vec::new();
    let content_named = |index: usize| values.stated_id(index).is_some();
    for each in values.each() {
        let (i, (t, q)) = each?;
        // The kind of quantization asked once: each `quant_params_as_*` reads it again.
        match q.map(|q| (q, q.quant_params_type())) {
            Some((q, fb::XNNQuantParams::PerChannelQuant)) => scales.extend(
                q.quant_params_as_per_channel_quant()
                    .map(|p| p.scale_buffer_idx()),
            ),
            Some((q, fb::XNNQuantParams::PerChannelGroupQuant)) => {
                if let Some(p) = q.quant_params_as_per_channel_group_quant() {
                    // A packed blockwise filter's scales are read only to pack it (XNNPACK
                    // patch 0007): they too wait behind a placeholder, of one bf16 per block.
                    let index = p.scale_buffer_idx() as usize;
                    let blocks = dims_of(&t)
                        .iter()
                        .try_fold(1usize, |n, &d| n.checked_mul(d))
                        .zip(Some(p.group_size() as usize).filter(|&g| g > 0))
                        .map(|(n, g)| n / g);
                    match blocks {
                        Some(blocks)
                            if index != 0
                                && packed.contains(&t.id_out())
                                && content_named(index) =>
                        {
                            blockwise_scales.push((index, blocks * 2))
                        }
                        _ => scales.push(index as u32),
                    }
                }
            }
            _ => {}
        }
        let index = constant_index(&t);
        if index == 0 || !packed.contains(&t.id_out()) {
            continue;
        }
        if !content_named(index) {
            continue;
        }
        let Some(len) = datatype(t.datatype(), i)?.tensor_bytes(&dims_of(&t)) else {
            continue;
        };
        deferrable.insert(index, len);
    }
    for (index, len) in blockwise_scales {
        deferrable.insert(index, len);
    }
    // Scales read at every launch, or shared with a value they are not the blockwise scales of,
    // are read as they are.
    for s in scales {
        deferrable.remove(&(s as usize));
    }
    Ok(deferrable)
}

/// The constants (by constant_data index) behind an operand XNNPACK packs into the weights
/// cache: a warm launch finds their packing and never reads them. `packed`: the graph's
/// [`packed_operands`](super::operators::packed_operands).
pub(super) fn packed_constants(
    values: &Values<'_>,
    packed: &FastSet<u32>,
) -> Result<FastSet<usize>, DelegateError> {
    let mut out = FastSet::default();
    for each in values.each() {
        let (_, (t, _)) = each?;
        if packed.contains(&t.id_out()) {
            out.insert(constant_index(&t));
        }
    }
    Ok(out)
}

/// How constants are given to XNNPACK other than as their bytes, by constant_data index.
pub(super) struct Treatment<'a> {
    /// Left unread, behind placeholders (with the byte length the graph gives them).
    pub(super) deferrable: &'a FastMap<usize, usize>,
    /// Converted: a converted copy, or a placeholder of the converted size.
    pub(super) converted: &'a FastMap<usize, Conversion>,
    /// The graph's [`packed_operands`](super::operators::packed_operands).
    pub(super) packed: &'a FastSet<u32>,
}

/// Loads every constant the graph refers to, through the shared data cache, treated as
/// `treatment` says. A constant lent to the packed-weight cache to be kept is lent by
/// `lender` (see [`read_keeping`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_constants(
    values: &Values<'_>,
    payload: &DataBuffer,
    inline: &[u8],
    inline_offset: usize,
    map: &dyn NamedDataMap,
    model: &ModelContext,
    treatment: Treatment<'_>,
    lender: u64,
) -> Result<Constants, DelegateError> {
    let Treatment {
        deferrable,
        converted,
        packed,
    } = treatment;
    let graph = values.graph();
    let shared = model.backend().shared_data();
    let packed = packed_constants(values, packed)?;
    // Where the map costs a system call per constant, the constants XNNPACK reads at every
    // launch are kept in the packed-weight cache's file and read there.
    let kept = match model.weights() {
        crate::backend::Weights::Packed(cache) if map.buffers_live_with_program() => {
            Some(cache.clone())
        }
        _ => None,
    };
    // Asked of the graph's values only where a named constant is read as it is (a decoder's
    // delegates have none: each of its constants is packed, and left unread).
    let read_as_they_are = || {
        graph
            .constant_data()
            .iter()
            .flatten()
            .enumerate()
            .skip(1)
            .any(|(i, c)| {
                !deferrable.contains_key(&i) && c.named_key().is_some_and(|k| !k.is_empty())
            })
    };
    let lengths = match kept {
        Some(_) if read_as_they_are() => constant_lengths(values)?,
        _ => FastMap::default(),
    };
    // One entry per constant_data entry past index 0 (pushed one by one, the list doubled past
    // them).
    let mut out = Vec::with_capacity(
        graph
            .constant_data()
            .map_or(0, |c| c.len().saturating_sub(1)),
    );
    model.backend().reserve_placeholders(deferrable.len());
    for (i, c) in graph.constant_data().iter().flatten().enumerate().skip(1) {
        let key = c.named_key().unwrap_or("");
        // Left unread only when the map lists the key (from its index: nothing is read) and,
        // where the index tells sizes, at the right size; a size it cannot tell is checked when
        // the bytes are read in. A key it does not list is loaded as usual (or found missing).
        let deferred_len = deferrable.get(&i).filter(|_| map.lists(key));
        if let Some(&len) = deferred_len {
            if let Some(Ok(size)) = map.tells_sizes().then(|| map.data_size(key))
                && size != len
            {
                return Err(DelegateError::BadGraph(format!(
                    "constant {i} ({key}): the named data holds {size} bytes, the graph \
                         needs {len}"
                )));
            }
            let conversion = converted.get(&i).copied();
            let placeholder = |shared_as: &str, len: usize| {
                model
                    .backend()
                    .deferred_constant_keyed(shared_as, len)
                    .map_err(|e| DelegateError::BadGraph(format!("constant {i}: {e}")))
            };
            // A converted placeholder is shared only with placeholders of the same conversion.
            let (key, data) = match conversion {
                Some(c) => {
                    let shared_as = format!("{key}\u{0}{}", c.name());
                    (
                        Arc::from(key),
                        placeholder(&shared_as, c.output_len(len))?.1,
                    )
                }
                None => placeholder(key, len)?,
            };
            out.push(Constant::Deferred {
                key,
                data,
                conversion,
            });
            continue;
        }
        let buffer = if !key.is_empty() {
            let content = values.stated_id(i);
            // A constant XNNPACK only packs is not kept: a launch that finds its packing never
            // reads it (one read as it is, to be packed in this launch's creation, would be
            // kept for nothing).
            let keepable = if packed.contains(&i) {
                None
            } else {
                keepable(
                    map,
                    key,
                    content,
                    kept.as_ref(),
                    lengths.get(&i).copied().flatten(),
                )
            };
            // Kept in the cache file already: its mapping is the backend's one copy, which
            // every delegate reads, so the shared data cache has nothing to add (an entry in it
            // cost more than the rest of the constant's load).
            if let Some(kept) =
                keepable.and_then(|(cache, content, len)| cache.kept_constant(content, len))
            {
                Constant::Kept(kept)
            } else {
                let data = shared
                    .get_or_init(
                        &shared_key(map, key, content.is_some()),
                        || match keepable {
                            Some((cache, content, len)) => {
                                read_keeping(map, key, cache, content, len, lender)
                            }
                            None => map.get_data(key),
                        },
                    )
                    .map_err(|source| DelegateError::MissingConstant {
                        key: key.to_string(),
                        source,
                    })?;
                if !packed.contains(&i) && keepable.is_none() {
                    // XNNPACK reads this one at every launch (a depthwise filter, a scale): ask
                    // for exactly its pages now, before a fault reads a window around them. (A
                    // kept one lies beside the others in the cache file, in the order they are
                    // first read: the window around it is what the launch reads next.)
                    data.buffer().read_soon();
                }
                Constant::Shared(data)
            }
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
        let backing = buffer.buffer().expect("not deferred");
        if let Some(&conversion) = converted.get(&i) {
            // The conversion is a copy of its own, with the room XNNPACK may over-read.
            let data = conversion.convert(backing.data(), i)?;
            out.push(Constant::Converted {
                source: Box::new(buffer),
                data,
                conversion,
            });
            continue;
        }
        out.push(padded_if_needed(buffer, i)?);
    }
    Ok(Constants(out.into_boxed_slice()))
}

/// `constant` (number `i`), or a padded copy of it where its bytes sit at the very end of their
/// backing: XNNPACK may read past the end of constant data. The copy holds the shared entry, so
/// other delegates still find it.
fn padded_if_needed(constant: Constant, i: usize) -> Result<Constant, DelegateError> {
    let backing = constant.buffer().expect("not deferred");
    if backing.slack_after() >= XNN_EXTRA_BYTES {
        return Ok(constant);
    }
    let copy = padded_copy(backing.data(), i)?;
    let held = match constant {
        Constant::Shared(s) => Some(s),
        Constant::Copied(_, held) => held,
        Constant::Kept(_) => None,
        Constant::Deferred { .. } | Constant::Converted { .. } => {
            unreachable!("neither is padded")
        }
    };
    Ok(Constant::Copied(copy, held))
}

/// The byte length of each constant the graph reads as a tensor or as per-channel scales,
/// where every use agrees on it (None where two disagree).
fn constant_lengths(values: &Values<'_>) -> Result<FastMap<usize, Option<usize>>, DelegateError> {
    let mut lengths: FastMap<usize, Option<usize>> = FastMap::default();
    let mut note = |index: usize, len: Option<usize>| {
        if index == 0 {
            return;
        }
        lengths
            .entry(index)
            .and_modify(|known| {
                if *known != len {
                    *known = None;
                }
            })
            .or_insert(len);
    };
    for each in values.each() {
        let (i, (t, q)) = each?;
        let dims = dims_of(&t);
        note(
            constant_index(&t),
            datatype(t.datatype(), i)?.tensor_bytes(&dims),
        );
        let per_channel =
            q.filter(|q| q.quant_params_type() == fb::XNNQuantParams::PerChannelQuant);
        if let Some(p) = per_channel.and_then(|q| q.quant_params_as_per_channel_quant()) {
            let channels = dims.get(p.channel_dim() as usize).copied();
            note(
                p.scale_buffer_idx() as usize,
                channels.and_then(|c| c.checked_mul(4)),
            );
        }
    }
    Ok(lengths)
}

/// The cache to keep the constant named `key` in, its content and its length, where it can be
/// kept: a cache that keeps constants, a key that names its bytes' sha256 in a map that lists
/// it and whose keys are taken as they claim (no data file to check them against, as with
/// ExecuTorch's maps), and a length the graph states.
fn keepable<'c>(
    map: &dyn NamedDataMap,
    key: &str,
    content: Option<BlobId>,
    cache: Option<&'c Arc<crate::cache::PackedWeightsCache>>,
    len: Option<usize>,
) -> Option<(&'c crate::cache::PackedWeightsCache, BlobId, usize)> {
    let cache = cache?;
    let content = content?;
    (map.file_identity(key).is_none() && map.lists(key)).then_some((&**cache, content, len?))
}

/// The constant named `key`, read from `map` (the caller found no entry keeping it) and kept in
/// `cache` for the next launch (when it is the length the graph states). A cache that saves to
/// a file is lent the buffer, by `lender`, and copies it when it saves, off the launch.
fn read_keeping(
    map: &dyn NamedDataMap,
    key: &str,
    cache: &crate::cache::PackedWeightsCache,
    content: BlobId,
    len: usize,
    lender: u64,
) -> Result<DataBuffer, crate::named_data::NamedDataError> {
    let data = map.get_data(key)?;
    if data.len() == len {
        if cache.saves_to_file() {
            cache.lend_constant(content, data.clone(), lender);
        } else {
            cache.keep_constant(content, data.data());
        }
    }
    Ok(data)
}

/// A copy of `data` (constant or value `what`'s) with the room after it XNNPACK may over-read.
pub(super) fn padded_copy(data: &[u8], what: usize) -> Result<DataBuffer, DelegateError> {
    let len = data.len();
    let mut padded =
        crate::aligned::AlignedBytes::zeroed(len + XNN_EXTRA_BYTES, 64).ok_or_else(|| {
            DelegateError::OutOfMemory {
                what: format!("a padded copy of constant {what}"),
                bytes: len + XNN_EXTRA_BYTES,
            }
        })?;
    padded.as_mut_slice()[..len].copy_from_slice(data);
    crate::named_data::count_copy(len);
    Ok(DataBuffer::new(Arc::new(padded), 0, len).expect("inside the copy"))
}

/// The key a constant is shared under across the backend. ExecuTorch's exporter names constants
/// by the sha256 of their bytes, so such a key means the same bytes in every map, and is shared
/// by all of them unless the map's buffers live only as long as its program. Any other key is
/// only meaningful within its map, so it is qualified by the map's source. `content_named`:
/// whether `key` states its bytes' identity ([`BlobId::from_named_key`]).
pub(super) fn shared_key(map: &dyn NamedDataMap, key: &str, content_named: bool) -> String {
    if content_named && !map.buffers_live_with_program() {
        key.to_string()
    } else {
        // Built by hand: cheaper than `format!`, and made for every constant at every launch.
        let name = map.name();
        let mut qualified = String::with_capacity(name.len() + 1 + key.len());
        qualified.push_str(name);
        qualified.push('\u{0}');
        qualified.push_str(key);
        qualified
    }
}

pub(super) fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

pub(super) fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes(b.try_into().expect("2 bytes")))
        .collect()
}

/// Finds each quantized value's scales in the payload or named data.
pub(super) fn load_scales(
    values: &Values<'_>,
    constants: &Constants,
) -> Result<ByValue<Scales>, DelegateError> {
    let from_constant = |index: u32, value: usize| -> Result<&[u8], DelegateError> {
        constants
            .get(index as usize)
            .and_then(|c| c.buffer())
            .map(|b| b.data())
            .ok_or_else(|| {
                DelegateError::BadGraph(format!("value {value}: scale constant {index} missing"))
            })
    };
    // Pushed by ascending value index, so sorted as they come.
    let mut scales = Vec::new();
    for each in values.each() {
        let (i, (_, Some(q))) = each? else {
            continue;
        };
        // Asked once (see `deferrable_constants`).
        let kind = q.quant_params_type();
        if kind != fb::XNNQuantParams::PerChannelQuant
            && kind != fb::XNNQuantParams::PerChannelGroupQuant
        {
            continue;
        }
        if let Some(p) = q.quant_params_as_per_channel_quant() {
            let index = p.scale_buffer_idx();
            let s = if index != 0 {
                ScaleValues::of_constant(index as usize, from_constant(index, i)?, f32s)
            } else {
                ScaleValues::Copied(p.scale().map(|s| s.iter().collect()).unwrap_or_default())
            };
            scales.push((i, Scales::F32(s)));
        } else if let Some(p) = q.quant_params_as_per_channel_group_quant() {
            let index = p.scale_buffer_idx();
            let deferred = matches!(
                constants.get(index as usize),
                Some(Constant::Deferred {
                    conversion: None,
                    ..
                })
            );
            let s = if index != 0 && deferred {
                ScaleValues::Deferred(index as usize)
            } else if index != 0 {
                ScaleValues::of_constant(index as usize, from_constant(index, i)?, u16s)
            } else {
                // fp32 scales inline (exporters before bf16 scale buffers): converted to the
                // bf16 XNNPACK takes as ExecuTorch's backend converts them, which reads no
                // `scale_bf16`.
                ScaleValues::Copied(
                    p.scale()
                        .map(|s| s.iter().map(bf16_as_executorch_rounds).collect())
                        .unwrap_or_default(),
                )
            };
            scales.push((i, Scales::Bf16(s)));
        }
    }
    Ok(ByValue::from_ascending(scales))
}

/// An fp32 scale as bf16, as ExecuTorch's backend converts inline blockwise scales: scaled by
/// 1 + 2^-8 (about), then truncated, so that most values round to nearest and the same bf16
/// comes out, bit for bit, as under ExecuTorch.
fn bf16_as_executorch_rounds(scale: f32) -> u16 {
    // The f32 nearest ExecuTorch's literal 1.00389105f, which has more digits than f32 holds.
    ((scale * 1.003_891_f32).to_bits() >> 16) as u16
}

/// The named key and placeholder of value `t`, if its constant is deferred and stands for the
/// key's bytes as they are (not converted).
pub(super) fn deferred_constant<'k>(
    t: &TensorView<'_>,
    keep: &'k Loaded,
) -> Option<(&'k str, &'k Arc<DeferredData>)> {
    keep.deferred_at(constant_index(t))
}

/// Pins (reads in, for the runtime's lifetime) the placeholders of values some node reads as
/// they are.
pub(super) fn pin_read_as_is(
    values: &Values<'_>,
    loaded: &Loaded,
    read_as_is: &ById<()>,
    deferral: Option<&Arc<dyn NamedDataMap>>,
) -> Result<(), DelegateError> {
    for each in values.each() {
        let (i, (t, _)) = each?;
        if !read_as_is.contains(t.id_out()) {
            continue;
        }
        if let Some(own) = loaded.private(i) {
            let Private::Placeholder { data, fill } = own else {
                continue;
            };
            let pinned = data.pin(&**fill);
            loaded.pinned.lock().push(data.clone());
            pinned.map_err(|source| DelegateError::UnreadConstant {
                key: format!("value {i}"),
                source,
            })?;
            continue;
        }
        let Some(Constant::Deferred {
            key,
            data,
            conversion,
        }) = loaded.constants.get(constant_index(&t))
        else {
            continue;
        };
        let map = deferral.expect("placeholders only with a source").clone();
        let pinned = data.pin(&*fill_from(map, key.clone(), *conversion));
        // Held (and unpinned on drop) even if the fill failed: pins must balance.
        loaded.pinned.lock().push(data.clone());
        pinned.map_err(|source| DelegateError::UnreadConstant {
            key: key.to_string(),
            source,
        })?;
    }
    Ok(())
}

/// The first placeholder of this delegate that XNNPACK needed but could not be read in.
pub(super) fn failed_fill(loaded: &Loaded) -> Option<DelegateError> {
    loaded.constants.iter().find_map(|c| match c {
        Constant::Deferred { key, data, .. } => {
            data.fill_error().map(|why| DelegateError::UnreadConstant {
                key: key.to_string(),
                source: why.into(),
            })
        }
        _ => None,
    })
}
