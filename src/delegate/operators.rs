//! The one table of XNNPACK nodes this delegate supports: for each, the node kind of ExecuTorch's
//! XNNPACK schema, the XNNPACK call it becomes, and how it is defined in the subgraph. Checking
//! a payload, defining its nodes, the builder's tests and docs/delegate.md's list all follow
//! from [`OPERATORS`].

use super::compile::{dims_of, tensor_of};
use super::error::{at, DelegateError};
use crate::schema::xnn as fb;
use crate::xnn::{
    Convolution2dParams, DepthwiseConvolution2dParams, FullyConnectedFlags, Padding2d, Subgraph,
    ValueRole,
};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

const NO_VALUE: u32 = u32::MAX;

/// A supported node.
pub struct Operator {
    /// The node's name in ExecuTorch's XNNPACK schema (`XNNFullyConnected`, ...).
    pub node: &'static str,
    /// The XNNPACK subgraph call(s) it is defined with.
    pub xnnpack: &'static str,
    kind: fb::XNodeUnion,
    define: Define,
}

/// Defines one node: the subgraph, the node, and what it refers to.
type Define =
    for<'k, 'g> fn(&mut Subgraph<'k>, &fb::XNode<'g>, &Node<'g, '_>) -> Result<(), DelegateError>;

/// What a node's definition looks up: value ids, the graph's values, where it is.
struct Node<'g, 'a> {
    index: usize,
    name: &'static str,
    ids: &'a HashMap<u32, u32>,
    values: &'a [fb::XValue<'g>],
    /// Payload ids whose data XNNPACK may read as they are (not only to pack them).
    read_as_is: &'a RefCell<HashSet<u32>>,
}

impl Node<'_, '_> {
    /// The subgraph id of payload value `payload_id`, an operand XNNPACK may read as it is.
    fn id(&self, payload_id: u32) -> Result<u32, DelegateError> {
        self.read_as_is.borrow_mut().insert(payload_id);
        self.packed(payload_id)
    }

    /// The subgraph id of payload value `payload_id`, an operand XNNPACK reads only to pack it
    /// (through the weights cache, so a cache hit reads nothing).
    fn packed(&self, payload_id: u32) -> Result<u32, DelegateError> {
        self.ids.get(&payload_id).copied().ok_or_else(|| {
            DelegateError::BadGraph(format!(
                "node {}: value {payload_id} is not defined",
                self.index
            ))
        })
    }

    fn optional(&self, payload_id: u32) -> Result<Option<u32>, DelegateError> {
        match payload_id {
            NO_VALUE => Ok(None),
            id => self.id(id).map(Some),
        }
    }

    fn what(&self) -> impl FnOnce() -> String + '_ {
        move || format!("node {} ({})", self.index, self.name)
    }
}

/// Every supported node, in the order docs/delegate.md lists them.
pub static OPERATORS: &[Operator] = &[
    Operator {
        node: "XNNFullyConnected",
        xnnpack: "xnn_define_fully_connected",
        kind: fb::XNodeUnion::XNNFullyConnected,
        define: fully_connected,
    },
    Operator {
        node: "XNNConv2d",
        xnnpack: "xnn_define_convolution_2d",
        kind: fb::XNodeUnion::XNNConv2d,
        define: convolution_2d,
    },
    Operator {
        node: "XNNDepthwiseConv2d",
        xnnpack: "xnn_define_depthwise_convolution_2d",
        kind: fb::XNodeUnion::XNNDepthwiseConv2d,
        define: depthwise_convolution_2d,
    },
    Operator {
        node: "XNNAdd",
        xnnpack: "xnn_define_binary (add), then xnn_define_clamp if clamped",
        kind: fb::XNodeUnion::XNNAdd,
        define: add,
    },
    Operator {
        node: "XNNMultiply",
        xnnpack: "xnn_define_binary (multiply), then xnn_define_clamp if clamped",
        kind: fb::XNodeUnion::XNNMultiply,
        define: multiply,
    },
    Operator {
        node: "XNNBatchMatrixMultiply",
        xnnpack: "xnn_define_batch_matrix_multiply",
        kind: fb::XNodeUnion::XNNBatchMatrixMultiply,
        define: batch_matrix_multiply,
    },
    Operator {
        node: "XNNClamp",
        xnnpack: "xnn_define_clamp",
        kind: fb::XNodeUnion::XNNClamp,
        define: clamp,
    },
    Operator {
        node: "XNNSoftmax",
        xnnpack: "xnn_define_softmax",
        kind: fb::XNodeUnion::XNNSoftmax,
        define: softmax,
    },
    Operator {
        node: "XNNConvert",
        xnnpack: "xnn_define_convert",
        kind: fb::XNodeUnion::XNNConvert,
        define: convert,
    },
    Operator {
        node: "XNNGlobalAvgPooling2d",
        xnnpack: "xnn_define_global_average_pooling_2d",
        kind: fb::XNodeUnion::XNNGlobalAvgPooling2d,
        define: global_average_pooling_2d,
    },
    Operator {
        node: "XNNStaticReshape",
        xnnpack: "xnn_define_static_reshape",
        kind: fb::XNodeUnion::XNNStaticReshape,
        define: static_reshape,
    },
    Operator {
        node: "XNNStaticTranspose",
        xnnpack: "xnn_define_static_transpose",
        kind: fb::XNodeUnion::XNNStaticTranspose,
        define: static_transpose,
    },
    Operator {
        node: "XNNStaticSlice",
        xnnpack: "xnn_define_static_slice",
        kind: fb::XNodeUnion::XNNStaticSlice,
        define: static_slice,
    },
    Operator {
        node: "XNNConcatenate2",
        xnnpack: "xnn_define_concatenate2",
        kind: fb::XNodeUnion::XNNConcatenate2,
        define: concatenate2,
    },
];

/// The operator of a node kind, if supported.
pub(crate) fn find(kind: fb::XNodeUnion) -> Option<&'static Operator> {
    OPERATORS.iter().find(|o| o.kind == kind)
}

/// The payload ids a supported node reads (an absent bias left out) and the one it writes.
pub(crate) fn node_io(node: &fb::XNode<'_>) -> Option<(Vec<u32>, u32)> {
    const NONE: u32 = u32::MAX;
    let present = |ids: &[u32]| ids.iter().copied().filter(|&i| i != NONE).collect();
    if let Some(n) = node
        .xnode_union_as_xnnconvert()
        .or_else(|| node.xnode_union_as_xnnclamp())
        .or_else(|| node.xnode_union_as_xnnsoftmax())
        .or_else(|| node.xnode_union_as_xnnglobal_avg_pooling_2d())
    {
        return Some((vec![n.input_id()], n.output_id()));
    }
    if let Some(n) = node
        .xnode_union_as_xnnadd()
        .or_else(|| node.xnode_union_as_xnnmultiply())
        .or_else(|| node.xnode_union_as_xnnbatch_matrix_multiply())
    {
        return Some((vec![n.input1_id(), n.input2_id()], n.output_id()));
    }
    if let Some(n) = node
        .xnode_union_as_xnnconv_2d()
        .or_else(|| node.xnode_union_as_xnndepthwise_conv_2d())
    {
        return Some((
            present(&[n.input1_id(), n.filter_id(), n.bias_id()]),
            n.output_id(),
        ));
    }
    if let Some(n) = node.xnode_union_as_xnnfully_connected() {
        return Some((
            present(&[n.input1_id(), n.filter_id(), n.bias_id()]),
            n.output_id(),
        ));
    }
    if let Some(n) = node.xnode_union_as_xnnconcatenate_2() {
        return Some((vec![n.input1_id(), n.input2_id()], n.output_id()));
    }
    if let Some(n) = node.xnode_union_as_xnnstatic_reshape() {
        return Some((vec![n.input_id()], n.output_id()));
    }
    if let Some(n) = node.xnode_union_as_xnnstatic_transpose() {
        return Some((vec![n.input_id()], n.output_id()));
    }
    if let Some(n) = node.xnode_union_as_xnnstatic_slice() {
        return Some((vec![n.input_id()], n.output_id()));
    }
    None
}

/// Whether the node named `node` in ExecuTorch's XNNPACK schema is supported.
pub fn is_supported(node: &str) -> bool {
    OPERATORS.iter().any(|o| o.node == node)
}

/// The payload ids of the operands XNNPACK reads only to pack them through the weights cache,
/// after a look-up keyed by their address: the filters of fully connected and convolution nodes.
/// Biases are left out: for dynamically quantized inputs XNNPACK packs the bias without it being
/// part of the look-up key. So is a convolution with one input channel per group, which XNNPACK
/// runs as a depthwise convolution. Whether another node also reads one as it is,
/// [`define_nodes`] tells.
pub(crate) fn packed_operands(graph: &fb::XNNGraph<'_>) -> HashSet<u32> {
    let mut packed = HashSet::new();
    for node in graph.xnodes().iter().flatten() {
        let filter = if let Some(fc) = node.xnode_union_as_xnnfully_connected() {
            fc.filter_id()
        } else if let Some(c) = node
            .xnode_union_as_xnnconv_2d()
            .filter(|c| c.groups() <= 1 || c.group_input_channels() != 1)
        {
            c.filter_id()
        } else {
            continue;
        };
        packed.insert(filter);
    }
    packed
}

/// Defines every node of the graph (checked against the table before anything was loaded).
/// Returns the payload ids of the operands some node may read as they are (not only to pack).
pub(crate) fn define_nodes(
    g: &mut Subgraph<'_>,
    graph: &fb::XNNGraph<'_>,
    ids: &HashMap<u32, u32>,
) -> Result<HashSet<u32>, DelegateError> {
    let values: Vec<fb::XValue<'_>> = graph.xvalues().iter().flatten().collect();
    let mut read_as_is = HashSet::new();
    for (index, node) in graph.xnodes().iter().flatten().enumerate() {
        read_as_is.extend(define_node(g, &values, index, &node, ids)?);
    }
    Ok(read_as_is)
}

/// Defines node `index` of the graph, whose payload value ids `ids` maps to subgraph ids.
/// Returns the payload ids of the operands it may read as they are (not only to pack).
pub(crate) fn define_node(
    g: &mut Subgraph<'_>,
    values: &[fb::XValue<'_>],
    index: usize,
    node: &fb::XNode<'_>,
    ids: &HashMap<u32, u32>,
) -> Result<HashSet<u32>, DelegateError> {
    let kind = node.xnode_union_type();
    let op = find(kind).ok_or_else(|| DelegateError::UnsupportedNode {
        index,
        name: kind
            .variant_name()
            .map_or_else(|| format!("node type {}", kind.0), str::to_string),
    })?;
    let read_as_is = RefCell::new(HashSet::new());
    let cx = Node {
        index,
        name: op.node,
        ids,
        values,
        read_as_is: &read_as_is,
    };
    (op.define)(g, node, &cx)?;
    Ok(read_as_is.into_inner())
}

/// The operands of a node whose weights XNNPACK packs (fully connected and 2-D convolution):
/// its input, filter, bias (`None` without one) and output payload ids.
pub(crate) fn packing_operands(node: &fb::XNode<'_>) -> Option<(u32, u32, Option<u32>, u32)> {
    let (input, filter, bias, output) = if let Some(fc) = node.xnode_union_as_xnnfully_connected() {
        (fc.input1_id(), fc.filter_id(), fc.bias_id(), fc.output_id())
    } else if let Some(c) = node.xnode_union_as_xnnconv_2d() {
        (c.input1_id(), c.filter_id(), c.bias_id(), c.output_id())
    } else {
        return None;
    };
    Some((input, filter, (bias != NO_VALUE).then_some(bias), output))
}

fn min_max(node: &fb::XNode<'_>) -> (f32, f32) {
    node.output_min_max()
        .map_or((f32::NEG_INFINITY, f32::INFINITY), |m| {
            (m.output_min(), m.output_max())
        })
}

fn malformed(cx: &Node<'_, '_>) -> DelegateError {
    DelegateError::BadGraph(format!(
        "node {}: not the {} its type says",
        cx.index, cx.name
    ))
}

fn fully_connected(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let fc = node
        .xnode_union_as_xnnfully_connected()
        .ok_or_else(|| malformed(cx))?;
    let (min, max) = min_max(node);
    let transpose = xnnpack_sys::XNN_FLAG_TRANSPOSE_WEIGHTS;
    if fc.flags() & !transpose != 0 {
        return Err(DelegateError::BadGraph(format!(
            "node {}: unknown fully connected flags {:#x}",
            cx.index,
            fc.flags()
        )));
    }
    let flags = FullyConnectedFlags {
        transpose_weights: fc.flags() & transpose != 0,
        ..Default::default()
    };
    g.define_fully_connected_with_flags(
        cx.id(fc.input1_id())?,
        cx.packed(fc.filter_id())?,
        cx.optional(fc.bias_id())?,
        cx.id(fc.output_id())?,
        min,
        max,
        flags,
    )
    .map_err(at(cx.what()))
}

/// The convolution node both 2-D convolutions are serialised as.
fn convolution_parts<'g>(
    node: &fb::XNode<'g>,
    cx: &Node<'g, '_>,
) -> Result<fb::_XNNNodeConv<'g>, DelegateError> {
    let c = node
        .xnode_union_as_xnnconv_2d()
        .or_else(|| node.xnode_union_as_xnndepthwise_conv_2d())
        .ok_or_else(|| malformed(cx))?;
    if c.flags() != 0 {
        return Err(DelegateError::BadGraph(format!(
            "node {}: unsupported convolution flags {:#x}",
            cx.index,
            c.flags()
        )));
    }
    Ok(c)
}

fn padding(c: &fb::_XNNNodeConv<'_>) -> Padding2d {
    Padding2d {
        top: c.padding_top(),
        right: c.padding_right(),
        bottom: c.padding_bottom(),
        left: c.padding_left(),
    }
}

fn convolution_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let c = convolution_parts(node, cx)?;
    let (min, max) = min_max(node);
    let mut p = Convolution2dParams::new(
        c.kernel_height(),
        c.kernel_width(),
        c.group_input_channels() as usize * c.groups() as usize,
        c.group_output_channels() as usize * c.groups() as usize,
    );
    p.padding = padding(&c);
    p.stride_height = c.subsampling_height();
    p.stride_width = c.subsampling_width();
    p.dilation_height = c.dilation_height();
    p.dilation_width = c.dilation_width();
    p.groups = c.groups();
    p.group_input_channels = c.group_input_channels() as usize;
    p.group_output_channels = c.group_output_channels() as usize;
    p.output_min = min;
    p.output_max = max;
    g.define_convolution_2d(
        &p,
        cx.id(c.input1_id())?,
        cx.packed(c.filter_id())?,
        cx.optional(c.bias_id())?,
        cx.id(c.output_id())?,
    )
    .map_err(at(cx.what()))
}

fn depthwise_convolution_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let c = convolution_parts(node, cx)?;
    let (min, max) = min_max(node);
    // ExecuTorch serialises depthwise as groups = channels, one input per group.
    let mut p = DepthwiseConvolution2dParams::new(
        c.kernel_height(),
        c.kernel_width(),
        c.groups() as usize,
        c.group_output_channels(),
    );
    p.padding = padding(&c);
    p.stride_height = c.subsampling_height();
    p.stride_width = c.subsampling_width();
    p.dilation_height = c.dilation_height();
    p.dilation_width = c.dilation_width();
    p.output_min = min;
    p.output_max = max;
    g.define_depthwise_convolution_2d(
        &p,
        cx.id(c.input1_id())?,
        cx.id(c.filter_id())?,
        cx.optional(c.bias_id())?,
        cx.id(c.output_id())?,
    )
    .map_err(at(cx.what()))
}

/// Add or multiply; XNNPACK's binary node has no clamp, so a clamped one writes to an internal
/// value and clamps that into the output.
fn binary(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
    multiply: bool,
) -> Result<(), DelegateError> {
    let b = node
        .xnode_union_as_xnnadd()
        .or_else(|| node.xnode_union_as_xnnmultiply())
        .ok_or_else(|| malformed(cx))?;
    let (min, max) = min_max(node);
    let (a, bb, out) = (
        cx.id(b.input1_id())?,
        cx.id(b.input2_id())?,
        cx.id(b.output_id())?,
    );
    let clamped = min != f32::NEG_INFINITY || max != f32::INFINITY;
    let target = if clamped {
        let dims = cx
            .values
            .get(b.output_id() as usize)
            .and_then(|v| tensor_of(*v, b.output_id() as usize).ok())
            .map(|(t, _)| dims_of(&t))
            .ok_or_else(|| DelegateError::BadGraph(format!("node {}: bad output", cx.index)))?;
        g.define_f32_tensor(&dims, ValueRole::Internal)
            .map_err(at(cx.what()))?
    } else {
        out
    };
    if multiply {
        g.define_multiply(a, bb, target).map_err(at(cx.what()))?;
    } else {
        g.define_add(a, bb, target).map_err(at(cx.what()))?;
    }
    if clamped {
        g.define_clamp(target, out, min, max)
            .map_err(at(cx.what()))?;
    }
    Ok(())
}

fn add(g: &mut Subgraph<'_>, node: &fb::XNode<'_>, cx: &Node<'_, '_>) -> Result<(), DelegateError> {
    binary(g, node, cx, false)
}

fn multiply(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    binary(g, node, cx, true)
}

fn batch_matrix_multiply(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let b = node
        .xnode_union_as_xnnbatch_matrix_multiply()
        .ok_or_else(|| malformed(cx))?;
    let transpose_b = xnnpack_sys::XNN_FLAG_TRANSPOSE_B;
    if b.flags() & !transpose_b != 0 {
        return Err(DelegateError::BadGraph(format!(
            "node {}: unknown batch matrix multiply flags {:#x}",
            cx.index,
            b.flags()
        )));
    }
    g.define_batch_matrix_multiply(
        cx.id(b.input1_id())?,
        cx.id(b.input2_id())?,
        cx.id(b.output_id())?,
        b.flags() & transpose_b != 0,
    )
    .map_err(at(cx.what()))
}

fn clamp(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnclamp()
        .ok_or_else(|| malformed(cx))?;
    let (min, max) = min_max(node);
    g.define_clamp(cx.id(u.input_id())?, cx.id(u.output_id())?, min, max)
        .map_err(at(cx.what()))
}

fn softmax(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnsoftmax()
        .ok_or_else(|| malformed(cx))?;
    g.define_softmax(cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

fn convert(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnconvert()
        .ok_or_else(|| malformed(cx))?;
    g.define_convert(cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

fn global_average_pooling_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnglobal_avg_pooling_2d()
        .ok_or_else(|| malformed(cx))?;
    let (min, max) = min_max(node);
    let keep_dims = u.flags() & xnnpack_sys::XNN_FLAG_KEEP_DIMS != 0;
    g.define_global_average_pooling_2d(
        cx.id(u.input_id())?,
        cx.id(u.output_id())?,
        min,
        max,
        keep_dims,
    )
    .map_err(at(cx.what()))
}

fn usizes(v: Option<flatbuffers::Vector<'_, u32>>) -> Vec<usize> {
    v.map(|s| s.iter().map(|x| x as usize).collect())
        .unwrap_or_default()
}

fn static_reshape(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let r = node
        .xnode_union_as_xnnstatic_reshape()
        .ok_or_else(|| malformed(cx))?;
    g.define_static_reshape(
        &usizes(r.new_shape()),
        cx.id(r.input_id())?,
        cx.id(r.output_id())?,
    )
    .map_err(at(cx.what()))
}

fn static_transpose(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let t = node
        .xnode_union_as_xnnstatic_transpose()
        .ok_or_else(|| malformed(cx))?;
    g.define_static_transpose(
        &usizes(t.perm()),
        cx.id(t.input_id())?,
        cx.id(t.output_id())?,
    )
    .map_err(at(cx.what()))
}

fn static_slice(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let sl = node
        .xnode_union_as_xnnstatic_slice()
        .ok_or_else(|| malformed(cx))?;
    g.define_static_slice(
        &usizes(sl.offsets()),
        &usizes(sl.sizes()),
        cx.id(sl.input_id())?,
        cx.id(sl.output_id())?,
    )
    .map_err(at(cx.what()))
}

fn concatenate2(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_, '_>,
) -> Result<(), DelegateError> {
    let c = node
        .xnode_union_as_xnnconcatenate_2()
        .ok_or_else(|| malformed(cx))?;
    g.define_concatenate2(
        c.axis() as i32,
        cx.id(c.input1_id())?,
        cx.id(c.input2_id())?,
        cx.id(c.output_id())?,
    )
    .map_err(at(cx.what()))
}
