//! Turns a validated payload into an XNNPACK runtime: constants come from the named-data map
//! through the shared data cache, packed weights from the packed-weight cache.

use super::error::{at, DelegateError};
use super::payload;
use crate::cache::{BlobId, OwnedRegistration, PackedWeightsCache};
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::schema::xnn as fb;
use crate::shared_cache::{SharedData, SharedDataCache};
use crate::xnn::{
    AsXnnWeightsCache, BlockwiseQuantization, ChannelwiseQuantization, Convolution2dParams,
    Datatype, DepthwiseConvolution2dParams, FullyConnectedFlags, InMemoryWeightsCache,
    OwnedRuntime, Padding2d, Subgraph, ValueRole, WeightsCache, XnnpackWeightsCache,
};
use std::collections::HashMap;
use std::sync::Arc;

const XNN_FLAG_EXTERNAL_INPUT: u32 = 1;
const XNN_FLAG_EXTERNAL_OUTPUT: u32 = 2;
const NO_VALUE: u32 = u32::MAX;
/// XNNPACK may read this many bytes past any tensor data.
const EXTRA_BYTES: usize = 16;

/// Everything a delegate's runtime borrows: owned here so the runtime can live in a handle.
pub(crate) struct Keep {
    payload: DataBuffer,
    /// Filled once, while the graph is built (the payload is parsed and verified once).
    loaded: std::sync::OnceLock<Loaded>,
    cache: Weights,
}

/// The constants and scales the runtime borrows.
struct Loaded {
    /// By constant_data index (0 is "no constant").
    constants: Vec<Option<Constant>>,
    /// Scales by value index, copied out of the payload or named data as typed arrays.
    scales: HashMap<usize, Scales>,
}

/// A constant's bytes: shared through the backend's cache, or a copy (inline in the payload,
/// or padded when the source had no room for XNNPACK's over-read; the shared entry is held too,
/// so other delegates still find it).
enum Constant {
    Shared(SharedData),
    Copied(DataBuffer, Option<SharedData>),
}

impl Constant {
    fn buffer(&self) -> &DataBuffer {
        match self {
            Constant::Shared(s) => s.buffer(),
            Constant::Copied(b, _) => b,
        }
    }
}

enum Scales {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
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
            Weights::Packed(c) => c
                .finalize()
                .map_err(|e| DelegateError::Cache(e.to_string())),
            Weights::Xnnpack(c) => c.finalize().map_err(at(|| "weights cache".to_string())),
            Weights::Provider(c) => {
                c.finalize();
                Ok(())
            }
        }
    }
}

/// What `execute` needs to know of the graph.
pub(crate) struct Io {
    pub inputs: Vec<(u32, Vec<usize>)>,
    pub outputs: Vec<(u32, Vec<usize>)>,
    /// How long `init` spent loading constants, creating the runtime, and finalizing.
    pub timings: InitTimings,
}

/// Where `init`'s time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InitTimings {
    /// Validating the payload and loading (mapping) its constants.
    pub load: std::time::Duration,
    /// Building the subgraph and creating the XNNPACK runtime (packing, or finding packed).
    pub create: std::time::Duration,
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
fn tensor_of(
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

/// Loads every constant the graph refers to, through the shared data cache.
fn load_constants(
    graph: &fb::XNNGraph<'_>,
    payload: &DataBuffer,
    inline: &[u8],
    inline_offset: usize,
    map: &dyn NamedDataMap,
    shared: &SharedDataCache,
) -> Result<Vec<Option<Constant>>, DelegateError> {
    let mut out: Vec<Option<Constant>> = vec![None];
    for (i, c) in graph.constant_data().iter().flatten().enumerate().skip(1) {
        let key = c.named_key().unwrap_or("");
        let buffer = if !key.is_empty() {
            let data = shared.get_or_init(key, || map.get_data(key)).map_err(|e| {
                DelegateError::MissingConstant {
                    key: key.to_string(),
                    reason: e.to_string(),
                }
            })?;
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
        let constant = if buffer.buffer().slack_after() < EXTRA_BYTES {
            let data = buffer.buffer().data();
            let mut padded = crate::aligned::AlignedBytes::zeroed(data.len() + EXTRA_BYTES, 64)
                .ok_or_else(|| DelegateError::BadGraph("out of memory".into()))?;
            padded.as_mut_slice()[..data.len()].copy_from_slice(data);
            let len = data.len();
            let held = match buffer {
                Constant::Shared(s) => Some(s),
                Constant::Copied(_, held) => held,
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

/// Copies each quantized value's scales out of the payload or named data.
fn load_scales(
    graph: &fb::XNNGraph<'_>,
    constants: &[Option<Constant>],
) -> Result<HashMap<usize, Scales>, DelegateError> {
    let from_constant = |index: u32, value: usize| -> Result<&[u8], DelegateError> {
        constants
            .get(index as usize)
            .and_then(|c| c.as_ref())
            .map(|c| c.buffer().data())
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
            let s = if p.scale_buffer_idx() != 0 {
                f32s(from_constant(p.scale_buffer_idx(), i)?)
            } else {
                p.scale().map(|s| s.iter().collect()).unwrap_or_default()
            };
            scales.insert(i, Scales::F32(s));
        } else if let Some(p) = q.quant_params_as_per_channel_group_quant() {
            let s = if p.scale_buffer_idx() != 0 {
                u16s(from_constant(p.scale_buffer_idx(), i)?)
            } else if let Some(bf16) = p.scale_bf16() {
                bf16.iter().collect()
            } else {
                // fp32 scales given: bf16 is their upper half (XNNPACK takes bf16 here).
                p.scale()
                    .map(|s| s.iter().map(|f| (f.to_bits() >> 16) as u16).collect())
                    .unwrap_or_default()
            };
            scales.insert(i, Scales::Bf16(s));
        }
    }
    Ok(scales)
}

/// The identity of a constant as packed weights are looked up by: named keys of ExecuTorch's
/// XNNPACK exporter are the sha256 of the bytes (no hashing needed); anything else is hashed.
fn identity(graph: &fb::XNNGraph<'_>, index: usize, keep: &Loaded) -> Option<BlobId> {
    let all = graph.constant_data()?;
    if index >= all.len() {
        return None;
    }
    let key = all.get(index).named_key().unwrap_or("");
    let data = keep.constants.get(index)?.as_ref()?.buffer();
    Some(BlobId::from_named_key(key).unwrap_or_else(|| BlobId::of_bytes(data.data())))
}

/// Registers the data of every constant value with the packed-weight cache, under its content
/// identity (combined with its scales' for quantized weights, whose packing includes them).
fn register_constants(
    graph: &fb::XNNGraph<'_>,
    keep: &Loaded,
    cache: &Arc<PackedWeightsCache>,
) -> Result<Vec<OwnedRegistration>, DelegateError> {
    let mut registrations = Vec::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, q) = tensor_of(v, i)?;
        let index = constant_index(&t);
        if index == 0 {
            continue;
        }
        let Some(mut id) = identity(graph, index, keep) else {
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
                identity(graph, scale_index, keep)
            } else {
                match keep.scales.get(&i) {
                    Some(Scales::F32(s)) => Some(BlobId::of_f32s(s)),
                    Some(Scales::Bf16(s)) => Some(BlobId::of_bytes(
                        &s.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
                    )),
                    None => None,
                }
            };
            if let Some(scale_id) = scale_id {
                id = BlobId::combine(&[id, scale_id]);
            }
        }
        let buffer = keep.constants[index]
            .as_ref()
            .expect("identity found it")
            .buffer();
        registrations.push(cache.register_owned(buffer.clone(), id));
    }
    Ok(registrations)
}

fn dims_of(t: &fb::XNNTensorValue<'_>) -> Vec<usize> {
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
        let (t, q) = tensor_of(v, i)?;
        let dims = dims_of(&t);
        let dt = datatype(t.datatype(), i)?;
        let index = constant_index(&t);
        let role = if index != 0 {
            let c = keep
                .constants
                .get(index)
                .and_then(|c| c.as_ref())
                .ok_or_else(|| {
                    DelegateError::BadGraph(format!("value {i}: constant {index} does not exist"))
                })?;
            ValueRole::Static(c.buffer().data())
        } else if t.flags() & XNN_FLAG_EXTERNAL_INPUT != 0 {
            ValueRole::Input(t.external_id())
        } else if t.flags() & XNN_FLAG_EXTERNAL_OUTPUT != 0 {
            ValueRole::Output(t.external_id())
        } else {
            ValueRole::Internal
        };
        let what = || format!("value {i} ({dt:?} {dims:?})");
        let id = match q {
            None => g.define_tensor(dt, &dims, role).map_err(at(what))?,
            Some(q) => {
                if let Some(p) = q.quant_params_as_per_tensor_quant() {
                    g.define_quantized_tensor(dt, &dims, p.zero_point(), p.scale(), role)
                        .map_err(at(what))?
                } else if let Some(p) = q.quant_params_as_per_token_dynamic_quant() {
                    g.define_dynamically_quantized_tensor(dt, &dims, p.num_nonbatch_dims() as usize)
                        .map_err(at(what))?
                } else if let Some(p) = q.quant_params_as_per_channel_quant() {
                    let Some(Scales::F32(scales)) = keep.scales.get(&i) else {
                        return Err(DelegateError::BadGraph(format!("value {i}: no scales")));
                    };
                    let quantization = ChannelwiseQuantization {
                        // ExecuTorch stores 4-bit weights as unsigned nibbles (value + 8).
                        zero_point: if dt == Datatype::Qcint4 { 8 } else { 0 },
                        scales,
                        channel_dim: p.channel_dim() as usize,
                    };
                    g.define_channelwise_quantized_tensor(dt, &dims, quantization, role)
                        .map_err(at(what))?
                } else if let Some(p) = q.quant_params_as_per_channel_group_quant() {
                    let Some(Scales::Bf16(scales)) = keep.scales.get(&i) else {
                        return Err(DelegateError::BadGraph(format!("value {i}: no scales")));
                    };
                    let quantization = BlockwiseQuantization {
                        zero_point: 8,
                        scales,
                        channel_dim: p.channel_dim() as usize,
                        block_size: p.group_size() as usize,
                    };
                    g.define_blockwise_quantized_tensor(dt, &dims, quantization, role)
                        .map_err(at(what))?
                } else {
                    return Err(DelegateError::BadGraph(format!(
                        "value {i}: unknown quantization {}",
                        q.quant_params_type().0
                    )));
                }
            }
        };
        ids.insert(t.id_out(), id);
    }
    Ok(ids)
}

fn min_max(node: &fb::XNode<'_>) -> (f32, f32) {
    node.output_min_max()
        .map_or((f32::NEG_INFINITY, f32::INFINITY), |m| {
            (m.output_min(), m.output_max())
        })
}

/// Defines every node.
fn define_nodes(
    g: &mut Subgraph<'_>,
    graph: &fb::XNNGraph<'_>,
    ids: &HashMap<u32, u32>,
) -> Result<(), DelegateError> {
    let id = |payload_id: u32, node: usize| -> Result<u32, DelegateError> {
        ids.get(&payload_id).copied().ok_or_else(|| {
            DelegateError::BadGraph(format!("node {node}: value {payload_id} is not defined"))
        })
    };
    let values: Vec<fb::XValue<'_>> = graph.xvalues().iter().flatten().collect();
    for (n, node) in graph.xnodes().iter().flatten().enumerate() {
        let kind = node.xnode_union_type();
        let name = kind.variant_name().unwrap_or("unknown node").to_string();
        let what = || format!("node {n} ({name})");
        let (min, max) = min_max(&node);
        if let Some(fc) = node.xnode_union_as_xnnfully_connected() {
            let bias = match fc.bias_id() {
                NO_VALUE => None,
                b => Some(id(b, n)?),
            };
            let transpose = xnnpack_sys::XNN_FLAG_TRANSPOSE_WEIGHTS;
            let flags = FullyConnectedFlags {
                transpose_weights: fc.flags() & transpose != 0,
                ..Default::default()
            };
            if fc.flags() & !transpose != 0 {
                return Err(DelegateError::BadGraph(format!(
                    "node {n}: unknown fully connected flags {:#x}",
                    fc.flags()
                )));
            }
            g.define_fully_connected_with_flags(
                id(fc.input1_id(), n)?,
                id(fc.filter_id(), n)?,
                bias,
                id(fc.output_id(), n)?,
                min,
                max,
                flags,
            )
            .map_err(at(what))?;
        } else if let Some(c) = node
            .xnode_union_as_xnnconv_2d()
            .or_else(|| node.xnode_union_as_xnndepthwise_conv_2d())
        {
            let padding = Padding2d {
                top: c.padding_top(),
                right: c.padding_right(),
                bottom: c.padding_bottom(),
                left: c.padding_left(),
            };
            let bias = match c.bias_id() {
                NO_VALUE => None,
                b => Some(id(b, n)?),
            };
            let (input, filter, output) = (
                id(c.input1_id(), n)?,
                id(c.filter_id(), n)?,
                id(c.output_id(), n)?,
            );
            if c.flags() != 0 {
                return Err(DelegateError::BadGraph(format!(
                    "node {n}: unsupported convolution flags {:#x}",
                    c.flags()
                )));
            }
            if kind == fb::XNodeUnion::XNNConv2d {
                let mut p = Convolution2dParams::new(
                    c.kernel_height(),
                    c.kernel_width(),
                    c.group_input_channels() as usize * c.groups() as usize,
                    c.group_output_channels() as usize * c.groups() as usize,
                );
                p.padding = padding;
                p.stride_height = c.subsampling_height();
                p.stride_width = c.subsampling_width();
                p.dilation_height = c.dilation_height();
                p.dilation_width = c.dilation_width();
                p.groups = c.groups();
                p.group_input_channels = c.group_input_channels() as usize;
                p.group_output_channels = c.group_output_channels() as usize;
                p.output_min = min;
                p.output_max = max;
                g.define_convolution_2d(&p, input, filter, bias, output)
                    .map_err(at(what))?;
            } else {
                // ExecuTorch serialises depthwise as groups = channels, one input per group.
                let mut p = DepthwiseConvolution2dParams::new(
                    c.kernel_height(),
                    c.kernel_width(),
                    c.groups() as usize,
                    c.group_output_channels(),
                );
                p.padding = padding;
                p.stride_height = c.subsampling_height();
                p.stride_width = c.subsampling_width();
                p.dilation_height = c.dilation_height();
                p.dilation_width = c.dilation_width();
                p.output_min = min;
                p.output_max = max;
                g.define_depthwise_convolution_2d(&p, input, filter, bias, output)
                    .map_err(at(what))?;
            }
        } else if let Some(b) = node
            .xnode_union_as_xnnadd()
            .or_else(|| node.xnode_union_as_xnnmultiply())
        {
            let (a, bb, out) = (
                id(b.input1_id(), n)?,
                id(b.input2_id(), n)?,
                id(b.output_id(), n)?,
            );
            let clamped = min != f32::NEG_INFINITY || max != f32::INFINITY;
            // XNNPACK's binary node has no clamp: write to an internal value and clamp it.
            let target = if clamped {
                let dims = values
                    .get(b.output_id() as usize)
                    .and_then(|v| tensor_of(*v, b.output_id() as usize).ok())
                    .map(|(t, _)| dims_of(&t))
                    .ok_or_else(|| DelegateError::BadGraph(format!("node {n}: bad output")))?;
                g.define_f32_tensor(&dims, ValueRole::Internal)
                    .map_err(at(what))?
            } else {
                out
            };
            if kind == fb::XNodeUnion::XNNAdd {
                g.define_add(a, bb, target).map_err(at(what))?;
            } else {
                g.define_multiply(a, bb, target).map_err(at(what))?;
            }
            if clamped {
                g.define_clamp(target, out, min, max).map_err(at(what))?;
            }
        } else if let Some(u) = node.xnode_union_as_xnnclamp() {
            g.define_clamp(id(u.input_id(), n)?, id(u.output_id(), n)?, min, max)
                .map_err(at(what))?;
        } else if let Some(u) = node.xnode_union_as_xnnsoftmax() {
            g.define_softmax(id(u.input_id(), n)?, id(u.output_id(), n)?)
                .map_err(at(what))?;
        } else if let Some(u) = node.xnode_union_as_xnnconvert() {
            g.define_convert(id(u.input_id(), n)?, id(u.output_id(), n)?)
                .map_err(at(what))?;
        } else if let Some(u) = node.xnode_union_as_xnnglobal_avg_pooling_2d() {
            let keep_dims = u.flags() & xnnpack_sys::XNN_FLAG_KEEP_DIMS != 0;
            g.define_global_average_pooling_2d(
                id(u.input_id(), n)?,
                id(u.output_id(), n)?,
                min,
                max,
                keep_dims,
            )
            .map_err(at(what))?;
        } else if let Some(r) = node.xnode_union_as_xnnstatic_reshape() {
            let shape: Vec<usize> = r
                .new_shape()
                .map(|s| s.iter().map(|x| x as usize).collect())
                .unwrap_or_default();
            g.define_static_reshape(&shape, id(r.input_id(), n)?, id(r.output_id(), n)?)
                .map_err(at(what))?;
        } else if let Some(sl) = node.xnode_union_as_xnnstatic_slice() {
            let list = |v: Option<flatbuffers::Vector<'_, u32>>| -> Vec<usize> {
                v.map(|s| s.iter().map(|x| x as usize).collect())
                    .unwrap_or_default()
            };
            g.define_static_slice(
                &list(sl.offsets()),
                &list(sl.sizes()),
                id(sl.input_id(), n)?,
                id(sl.output_id(), n)?,
            )
            .map_err(at(what))?;
        } else if let Some(c) = node.xnode_union_as_xnnconcatenate_2() {
            g.define_concatenate2(
                c.axis() as i32,
                id(c.input1_id(), n)?,
                id(c.input2_id(), n)?,
                id(c.output_id(), n)?,
            )
            .map_err(at(what))?;
        } else if let Some(t) = node.xnode_union_as_xnnstatic_transpose() {
            let perm: Vec<usize> = t
                .perm()
                .map(|s| s.iter().map(|x| x as usize).collect())
                .unwrap_or_default();
            g.define_static_transpose(&perm, id(t.input_id(), n)?, id(t.output_id(), n)?)
                .map_err(at(what))?;
        } else {
            return Err(DelegateError::UnsupportedNode { index: n, name });
        }
    }
    Ok(())
}

/// The external inputs and outputs, in the order the payload lists them.
fn io_of(graph: &fb::XNNGraph<'_>) -> Result<Io, DelegateError> {
    let values: Vec<fb::XValue<'_>> = graph.xvalues().iter().flatten().collect();
    let by_id: HashMap<u32, usize> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| tensor_of(*v, i).ok().map(|(t, _)| (t.id_out(), i)))
        .collect();
    let external = |list: Option<flatbuffers::Vector<'_, u32>>| -> Result<Vec<(u32, Vec<usize>)>, DelegateError> {
        list.iter()
            .flatten()
            .map(|vid| {
                let i = by_id.get(&vid).copied().ok_or_else(|| {
                    DelegateError::BadGraph(format!("external value {vid} is not defined"))
                })?;
                let (t, _) = tensor_of(values[i], i)?;
                Ok((t.external_id(), dims_of(&t)))
            })
            .collect()
    };
    // ExecuTorch binds a delegate call's arguments to external values in order of external id
    // (its XNNPACK executor sorts them), whatever order the payload lists them in.
    let mut inputs = external(graph.input_ids())?;
    let mut outputs = external(graph.output_ids())?;
    inputs.sort_by_key(|(id, _)| *id);
    outputs.sort_by_key(|(id, _)| *id);
    Ok(Io {
        inputs,
        outputs,
        timings: InitTimings::default(),
    })
}

/// Rejects unsupported nodes before anything is loaded.
fn check_nodes(graph: &fb::XNNGraph<'_>) -> Result<(), DelegateError> {
    for (n, node) in graph.xnodes().iter().flatten().enumerate() {
        let kind = node.xnode_union_type();
        let supported = matches!(
            kind,
            fb::XNodeUnion::XNNFullyConnected
                | fb::XNodeUnion::XNNConv2d
                | fb::XNodeUnion::XNNDepthwiseConv2d
                | fb::XNodeUnion::XNNAdd
                | fb::XNodeUnion::XNNMultiply
                | fb::XNodeUnion::XNNClamp
                | fb::XNodeUnion::XNNSoftmax
                | fb::XNodeUnion::XNNConvert
                | fb::XNodeUnion::XNNGlobalAvgPooling2d
                | fb::XNodeUnion::XNNStaticReshape
                | fb::XNodeUnion::XNNStaticTranspose
                | fb::XNodeUnion::XNNStaticSlice
                | fb::XNodeUnion::XNNConcatenate2
        );
        if !supported {
            return Err(DelegateError::UnsupportedNode {
                index: n,
                name: kind
                    .variant_name()
                    .map_or_else(|| format!("node type {}", kind.0), str::to_string),
            });
        }
    }
    Ok(())
}

/// What building the graph hands back besides the subgraph: the io, the registrations that
/// must outlive runtime creation, and how long loading took.
type Built = (Io, Vec<OwnedRegistration>, std::time::Duration);

/// Validates the payload (once), loads its constants, builds and creates the runtime.
pub(crate) fn compile(
    payload_bytes: DataBuffer,
    map: &dyn NamedDataMap,
    shared: &SharedDataCache,
    cache: Weights,
) -> Result<(OwnedRuntime<Keep>, Io), DelegateError> {
    let keep = Keep {
        payload: payload_bytes,
        loaded: std::sync::OnceLock::new(),
        cache,
    };
    let started = std::time::Instant::now();
    let (runtime, (mut io, registrations, load_time)) = OwnedRuntime::build(
        keep,
        |k| k.cache.as_xnn(),
        |k| -> Result<(Subgraph<'_>, Built), DelegateError> {
            let p = payload::parse(&k.payload)?;
            check_nodes(&p.graph)?;
            let constants = load_constants(
                &p.graph,
                &k.payload,
                p.constant_data,
                p.header.constant_data_offset as usize,
                map,
                shared,
            )?;
            let scales = load_scales(&p.graph, &constants)?;
            let loaded = k.loaded.get_or_init(|| Loaded { constants, scales });
            let io = io_of(&p.graph)?;
            let load_time = started.elapsed();
            let registrations = match &k.cache {
                Weights::Packed(cache) => register_constants(&p.graph, loaded, cache)?,
                _ => Vec::new(),
            };
            let mut g = Subgraph::new(p.graph.num_externs()).map_err(at(|| "subgraph".into()))?;
            let ids = define_values(&mut g, &p.graph, loaded)?;
            define_nodes(&mut g, &p.graph, &ids)?;
            Ok((g, (io, registrations, load_time)))
        },
    )?;
    drop(registrations);
    io.timings.load = load_time;
    io.timings.create = started.elapsed() - load_time;
    let started = std::time::Instant::now();
    runtime.keep().cache.finalize()?;
    io.timings.finalize = started.elapsed();
    Ok((runtime, io))
}
