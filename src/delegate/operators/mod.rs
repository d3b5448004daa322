//! The one table of XNNPACK nodes this delegate supports: for each, the node kind of ExecuTorch's
//! XNNPACK schema, the XNNPACK call it becomes, how it is defined in the subgraph, the values it
//! reads and writes, the operand it packs through the weights cache, and what that packing
//! depends on. Checking a payload, defining its nodes, ordering and deferring its constants, the
//! identities packed weights are looked up by, the builder's tests and docs/delegate.md's list
//! all follow from [`OPERATORS`]: a new node is one new row (and its definition).

use super::error::DelegateError;
use super::graph::ById;
use crate::cache::Description;
use crate::fast_hash::FastSet;
use crate::schema::xnn as fb;
use crate::xnn::Subgraph;
use std::cell::RefCell;

mod define;
// The rows' `define` functions, by name.
use define::*;

pub(super) const NO_VALUE: u32 = u32::MAX;

/// A supported node.
pub struct Operator {
    /// The node's name in ExecuTorch's XNNPACK schema (`XNNFullyConnected`, ...).
    pub node: &'static str,
    /// The XNNPACK subgraph call(s) it is defined with.
    pub xnnpack: &'static str,
    kind: fb::XNodeUnion,
    define: Define,
    /// The payload ids it reads (an absent bias left out) and those it writes.
    io: Io,
    /// The operand XNNPACK reads only to pack it, through the weights cache after a look-up
    /// keyed by its address, if any (see [`packed_operands`]).
    packs: Packs,
    /// The operand XNNPACK may pack through the weights cache, if any, with what its packing
    /// depends on (see [`packing`]). Wider than `packs`: a depthwise or transposed convolution
    /// and a batch matrix multiply pack too, though they may also read the operand as it is.
    /// None for a node that packs nothing.
    packing: Option<PackingOf>,
}

/// What a node reads and writes; None when its table is not the one its kind names.
type Io = for<'g> fn(&fb::XNode<'g>) -> Option<NodeIo>;

/// The payload id of the operand a node packs through the weights cache, if any.
type Packs = for<'g> fn(&fb::XNode<'g>) -> Option<u32>;

/// How a node packs a constant operand, if it may: the values its packing is described by (see
/// [`Packing`]), after the node's own parameters that may shape the packed layout, written into
/// the description.
type PackingOf = for<'g> fn(&fb::XNode<'g>, &mut Description) -> Option<Packing>;

/// The payload ids a node's packing of its operand `filter` is described by, beyond the node's
/// parameters: XNNPACK packs a static int8 layer's requantization scales, derived from the
/// input's and output's quantization, into the weights, and a dynamically quantized layer's bias
/// too (`delegate::weight_identities` makes the packing context of them).
pub(super) struct Packing {
    pub(super) input: u32,
    /// The operand packed.
    pub(super) filter: u32,
    /// [`NO_VALUE`] where the node has none.
    pub(super) bias: u32,
    pub(super) output: u32,
}

/// Defines one node: the subgraph, the node, and what it refers to.
type Define =
    for<'k, 'g> fn(&mut Subgraph<'k>, &fb::XNode<'g>, &Node<'_>) -> Result<(), DelegateError>;

/// What a node's definition looks up: value ids and where it is.
struct Node<'a> {
    index: usize,
    name: &'static str,
    ids: &'a ById<u32>,
    /// Payload ids whose data XNNPACK may read as they are (not only to pack them).
    read_as_is: &'a RefCell<ById<()>>,
    /// [`qb4w_gemm_inputs`] of the graph.
    qb4w_gemm_inputs: &'a FastSet<u32>,
}

impl Node<'_> {
    /// The subgraph id of payload value `payload_id`, an operand XNNPACK may read as it is.
    fn id(&self, payload_id: u32) -> Result<u32, DelegateError> {
        // Marked once found defined: the table holds the ids of defined values.
        let id = self.packed(payload_id)?;
        self.read_as_is.borrow_mut().insert(payload_id, ());
        Ok(id)
    }

    /// The subgraph id of payload value `payload_id`, an operand XNNPACK reads only to pack it
    /// (through the weights cache, so a cache hit reads nothing).
    fn packed(&self, payload_id: u32) -> Result<u32, DelegateError> {
        self.ids.get(payload_id).copied().ok_or_else(|| {
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
        io: fully_connected_io,
        packs: fully_connected_filter,
        packing: Some(fully_connected_packing),
    },
    Operator {
        node: "XNNConv2d",
        xnnpack: "xnn_define_convolution_2d",
        kind: fb::XNodeUnion::XNNConv2d,
        define: convolution_2d,
        io: convolution_io,
        packs: convolution_filter,
        packing: Some(convolution_packing),
    },
    Operator {
        node: "XNNDepthwiseConv2d",
        xnnpack: "xnn_define_depthwise_convolution_2d",
        kind: fb::XNodeUnion::XNNDepthwiseConv2d,
        define: depthwise_convolution_2d,
        io: convolution_io,
        packs: nothing_packed,
        packing: Some(convolution_packing),
    },
    Operator {
        node: "XNNAdd",
        xnnpack: "xnn_define_binary (add, clamped to the node's min/max)",
        kind: fb::XNodeUnion::XNNAdd,
        define: add,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNMultiply",
        xnnpack: "xnn_define_binary (multiply, clamped to the node's min/max)",
        kind: fb::XNodeUnion::XNNMultiply,
        define: multiply,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNBatchMatrixMultiply",
        xnnpack: "xnn_define_batch_matrix_multiply",
        kind: fb::XNodeUnion::XNNBatchMatrixMultiply,
        define: batch_matrix_multiply,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: Some(batch_matrix_multiply_packing),
    },
    Operator {
        node: "XNNClamp",
        xnnpack: "xnn_define_clamp",
        kind: fb::XNodeUnion::XNNClamp,
        define: clamp,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNSoftmax",
        xnnpack: "xnn_define_softmax",
        kind: fb::XNodeUnion::XNNSoftmax,
        define: softmax,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNConvert",
        xnnpack: "xnn_define_convert",
        kind: fb::XNodeUnion::XNNConvert,
        define: convert,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNGlobalAvgPooling2d",
        xnnpack: "xnn_define_global_average_pooling_2d",
        kind: fb::XNodeUnion::XNNGlobalAvgPooling2d,
        define: global_average_pooling_2d,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNStaticReshape",
        xnnpack: "xnn_define_static_reshape",
        kind: fb::XNodeUnion::XNNStaticReshape,
        define: static_reshape,
        io: static_reshape_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNStaticTranspose",
        xnnpack: "xnn_define_static_transpose",
        kind: fb::XNodeUnion::XNNStaticTranspose,
        define: static_transpose,
        io: static_transpose_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNStaticSlice",
        xnnpack: "xnn_define_static_slice",
        kind: fb::XNodeUnion::XNNStaticSlice,
        define: static_slice,
        io: static_slice_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNConcatenate2",
        xnnpack: "xnn_define_concatenate2",
        kind: fb::XNodeUnion::XNNConcatenate2,
        define: concatenate,
        io: concatenation_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNSubtract",
        xnnpack: "xnn_define_binary (subtract, clamped to the node's min/max)",
        kind: fb::XNodeUnion::XNNSubtract,
        define: subtract,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNDiv",
        xnnpack: "xnn_define_binary (divide, clamped to the node's min/max)",
        kind: fb::XNodeUnion::XNNDiv,
        define: divide,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNMinimum",
        xnnpack: "xnn_define_binary (minimum)",
        kind: fb::XNodeUnion::XNNMinimum,
        define: minimum,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNMaximum",
        xnnpack: "xnn_define_binary (maximum)",
        kind: fb::XNodeUnion::XNNMaximum,
        define: maximum,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNPReLU",
        xnnpack: "xnn_define_prelu",
        kind: fb::XNodeUnion::XNNPReLU,
        define: prelu,
        io: two_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNAbs",
        xnnpack: "xnn_define_unary (abs)",
        kind: fb::XNodeUnion::XNNAbs,
        define: abs,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNCeiling",
        xnnpack: "xnn_define_unary (ceiling)",
        kind: fb::XNodeUnion::XNNCeiling,
        define: ceiling,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNExp",
        xnnpack: "xnn_define_unary (exp)",
        kind: fb::XNodeUnion::XNNExp,
        define: exp,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNFloor",
        xnnpack: "xnn_define_unary (floor)",
        kind: fb::XNodeUnion::XNNFloor,
        define: floor,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNGelu",
        xnnpack: "xnn_define_unary (gelu)",
        kind: fb::XNodeUnion::XNNGelu,
        define: gelu,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNHardswish",
        xnnpack: "xnn_define_unary (hardswish)",
        kind: fb::XNodeUnion::XNNHardswish,
        define: hardswish,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNLog",
        xnnpack: "xnn_define_unary (log)",
        kind: fb::XNodeUnion::XNNLog,
        define: log,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNNegate",
        xnnpack: "xnn_define_unary (negate)",
        kind: fb::XNodeUnion::XNNNegate,
        define: negate,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNReciprocalSquareRoot",
        xnnpack: "xnn_define_unary (reciprocal_square_root)",
        kind: fb::XNodeUnion::XNNReciprocalSquareRoot,
        define: reciprocal_square_root,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNSigmoid",
        xnnpack: "xnn_define_unary (sigmoid)",
        kind: fb::XNodeUnion::XNNSigmoid,
        define: sigmoid,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNSin",
        xnnpack: "xnn_define_unary (sine)",
        kind: fb::XNodeUnion::XNNSin,
        define: sine,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNCos",
        xnnpack: "xnn_define_unary (cosine)",
        kind: fb::XNodeUnion::XNNCos,
        define: cosine,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNSquare",
        xnnpack: "xnn_define_unary (square)",
        kind: fb::XNodeUnion::XNNSquare,
        define: square,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNSquareRoot",
        xnnpack: "xnn_define_unary (square_root)",
        kind: fb::XNodeUnion::XNNSquareRoot,
        define: square_root,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNTanh",
        xnnpack: "xnn_define_unary (tanh)",
        kind: fb::XNodeUnion::XNNTanh,
        define: tanh,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNLeakyReLU",
        xnnpack: "xnn_define_unary (leaky_relu, negative_slope)",
        kind: fb::XNodeUnion::XNNLeakyReLU,
        define: leaky_relu,
        io: leaky_relu_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNELU",
        xnnpack: "xnn_define_unary (elu, alpha)",
        kind: fb::XNodeUnion::XNNELU,
        define: elu,
        io: elu_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNMaxPooling2d",
        xnnpack: "xnn_define_max_pooling_2d",
        kind: fb::XNodeUnion::XNNMaxPooling2d,
        define: max_pooling_2d,
        io: pooling_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNAvgPooling2d",
        xnnpack: "xnn_define_average_pooling_2d",
        kind: fb::XNodeUnion::XNNAvgPooling2d,
        define: average_pooling_2d,
        io: pooling_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNArgMaxPooling2d",
        xnnpack: "xnn_define_argmax_pooling_2d",
        kind: fb::XNodeUnion::XNNArgMaxPooling2d,
        define: argmax_pooling_2d,
        io: arg_max_pooling_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNConvTranspose2d",
        xnnpack: "xnn_define_deconvolution_2d",
        kind: fb::XNodeUnion::XNNConvTranspose2d,
        define: deconvolution_2d,
        io: convolution_io,
        packs: nothing_packed,
        packing: Some(convolution_packing),
    },
    Operator {
        node: "XNNStaticConstantPad",
        xnnpack: "xnn_define_static_constant_pad",
        kind: fb::XNodeUnion::XNNStaticConstantPad,
        define: static_constant_pad,
        io: constant_pad_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNStaticResizeBilinear2D",
        xnnpack: "xnn_define_static_resize_bilinear_2d",
        kind: fb::XNodeUnion::XNNStaticResizeBilinear2D,
        define: static_resize_bilinear_2d,
        io: resize_bilinear_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNConcatenate3",
        xnnpack: "xnn_define_concatenate3",
        kind: fb::XNodeUnion::XNNConcatenate3,
        define: concatenate,
        io: concatenation_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNConcatenate4",
        xnnpack: "xnn_define_concatenate4",
        kind: fb::XNodeUnion::XNNConcatenate4,
        define: concatenate,
        io: concatenation_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNConcatenate5",
        xnnpack: "xnn_define_concatenate5",
        kind: fb::XNodeUnion::XNNConcatenate5,
        define: concatenate,
        io: concatenation_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNCopy",
        xnnpack: "xnn_define_copy",
        kind: fb::XNodeUnion::XNNCopy,
        define: copy,
        io: one_to_one_io,
        packs: nothing_packed,
        packing: None,
    },
    Operator {
        node: "XNNScaledDotProductAttention",
        xnnpack: "xnn_define_scaled_dot_product_attention",
        kind: fb::XNodeUnion::XNNScaledDotProductAttention,
        define: scaled_dot_product_attention,
        io: attention_io,
        packs: nothing_packed,
        packing: None,
    },
];

/// The operator of a node kind, if supported.
pub fn find(kind: fb::XNodeUnion) -> Option<&'static Operator> {
    OPERATORS.iter().find(|o| o.kind == kind)
}

/// The one-input, one-output table of a node of that shape.
fn one_to_one<'g>(node: &fb::XNode<'g>) -> Option<fb::_XNNNode1x1<'g>> {
    node.xnode_union_as_xnnconvert()
        .or_else(|| node.xnode_union_as_xnnclamp())
        .or_else(|| node.xnode_union_as_xnnsoftmax())
        .or_else(|| node.xnode_union_as_xnnglobal_avg_pooling_2d())
        .or_else(|| node.xnode_union_as_xnnabs())
        .or_else(|| node.xnode_union_as_xnnceiling())
        .or_else(|| node.xnode_union_as_xnnexp())
        .or_else(|| node.xnode_union_as_xnnfloor())
        .or_else(|| node.xnode_union_as_xnngelu())
        .or_else(|| node.xnode_union_as_xnnhardswish())
        .or_else(|| node.xnode_union_as_xnnlog())
        .or_else(|| node.xnode_union_as_xnnnegate())
        .or_else(|| node.xnode_union_as_xnnreciprocal_square_root())
        .or_else(|| node.xnode_union_as_xnnsigmoid())
        .or_else(|| node.xnode_union_as_xnnsin())
        .or_else(|| node.xnode_union_as_xnncos())
        .or_else(|| node.xnode_union_as_xnnsquare())
        .or_else(|| node.xnode_union_as_xnnsquare_root())
        .or_else(|| node.xnode_union_as_xnntanh())
        .or_else(|| node.xnode_union_as_xnncopy())
}

/// The two-input, one-output table of a node of that shape.
fn two_to_one<'g>(node: &fb::XNode<'g>) -> Option<fb::_XNNNode2x1<'g>> {
    node.xnode_union_as_xnnadd()
        .or_else(|| node.xnode_union_as_xnnmultiply())
        .or_else(|| node.xnode_union_as_xnnsubtract())
        .or_else(|| node.xnode_union_as_xnndiv())
        .or_else(|| node.xnode_union_as_xnnminimum())
        .or_else(|| node.xnode_union_as_xnnmaximum())
        .or_else(|| node.xnode_union_as_xnnpre_lu())
        .or_else(|| node.xnode_union_as_xnnbatch_matrix_multiply())
}

/// The concatenation table of a node of 2 to 5 inputs, with its inputs in order.
fn concatenation<'g>(node: &fb::XNode<'g>) -> Option<(fb::_XNNCat<'g>, Vec<u32>)> {
    let (c, n) = if let Some(c) = node.xnode_union_as_xnnconcatenate_2() {
        (c, 2)
    } else if let Some(c) = node.xnode_union_as_xnnconcatenate_3() {
        (c, 3)
    } else if let Some(c) = node.xnode_union_as_xnnconcatenate_4() {
        (c, 4)
    } else {
        (node.xnode_union_as_xnnconcatenate_5()?, 5)
    };
    let all = [
        c.input1_id(),
        c.input2_id(),
        c.input3_id(),
        c.input4_id(),
        c.input5_id(),
    ];
    Some((c, all[..n].to_vec()))
}

/// The pooling table of a max or average pooling node.
fn pooling<'g>(node: &fb::XNode<'g>) -> Option<fb::_XNNPooling2D<'g>> {
    node.xnode_union_as_xnnmax_pooling_2d()
        .or_else(|| node.xnode_union_as_xnnavg_pooling_2d())
}

/// The convolution table of a 2-D, depthwise or transposed convolution node.
fn convolution<'g>(node: &fb::XNode<'g>) -> Option<fb::_XNNNodeConv<'g>> {
    node.xnode_union_as_xnnconv_2d()
        .or_else(|| node.xnode_union_as_xnndepthwise_conv_2d())
        .or_else(|| node.xnode_union_as_xnnconv_transpose_2d())
}

/// Every node's reads and writes ([`node_io`]; None for an unsupported node), by node index,
/// worked out once per init: the checks, the fusion order, the choice of threads and the qb4w
/// layouts each walk them, and a node's are found by a search of the table and a probe of its
/// union. Held inline, one allocation for the graph (two per node made a warm launch's
/// allocator the costliest part of this pass).
pub(crate) struct GraphIo(Vec<Option<NodeIo>>);

impl GraphIo {
    pub(crate) fn of(graph: &fb::XNNGraph<'_>) -> GraphIo {
        GraphIo(
            graph
                .xnodes()
                .iter()
                .flatten()
                .map(|n| node_io(&n))
                .collect(),
        )
    }

    /// Node `index`'s reads and writes, if it is supported.
    pub(crate) fn node(&self, index: usize) -> Option<(&[u32], &[u32])> {
        let io = self.0.get(index)?.as_ref()?;
        let (reads, rest) = io.ids.split_at(io.reads as usize);
        Some((reads, &rest[..io.writes as usize]))
    }
}

/// One node's reads then writes, payload ids in place: at most five reads (a five-input
/// concatenation, an attention) and two writes (argmax pooling's values and indices).
#[derive(Clone, Copy)]
pub(crate) struct NodeIo {
    ids: [u32; NodeIo::MOST],
    reads: u8,
    writes: u8,
}

impl NodeIo {
    const MOST: usize = 7;

    /// `reads`, then `writes`.
    fn new(reads: &[u32], writes: &[u32]) -> NodeIo {
        NodeIo::of(reads.iter().copied(), writes)
    }

    /// As [`new`](Self::new), with absent reads (`NO_VALUE`: a missing bias) left out.
    fn present(reads: &[u32], writes: &[u32]) -> NodeIo {
        NodeIo::of(reads.iter().copied().filter(|&id| id != NO_VALUE), writes)
    }

    fn of(reads: impl Iterator<Item = u32>, writes: &[u32]) -> NodeIo {
        let mut ids = [0; NodeIo::MOST];
        let mut n = 0;
        for id in reads {
            ids[n] = id;
            n += 1;
        }
        ids[n..n + writes.len()].copy_from_slice(writes);
        NodeIo {
            ids,
            reads: n as u8,
            writes: writes.len() as u8,
        }
    }
}

/// The payload ids a supported node reads (an absent bias left out) and those it writes: its
/// row's [`Io`].
fn node_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    (find(node.xnode_union_type())?.io)(node)
}

fn one_to_one_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = one_to_one(node)?;
    Some(NodeIo::new(&[n.input_id()], &[n.output_id()]))
}

fn two_to_one_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = two_to_one(node)?;
    Some(NodeIo::new(
        &[n.input1_id(), n.input2_id()],
        &[n.output_id()],
    ))
}

fn convolution_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = convolution(node)?;
    Some(NodeIo::present(
        &[n.input1_id(), n.filter_id(), n.bias_id()],
        &[n.output_id()],
    ))
}

fn fully_connected_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = node.xnode_union_as_xnnfully_connected()?;
    Some(NodeIo::present(
        &[n.input1_id(), n.filter_id(), n.bias_id()],
        &[n.output_id()],
    ))
}

fn concatenation_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let (c, inputs) = concatenation(node)?;
    Some(NodeIo::new(&inputs, &[c.output_id()]))
}

fn pooling_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = pooling(node)?;
    Some(NodeIo::new(&[n.input_id()], &[n.output_id()]))
}

fn arg_max_pooling_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = node.xnode_union_as_xnnarg_max_pooling_2d()?;
    Some(NodeIo::new(
        &[n.input_id()],
        &[n.output_value_id(), n.output_index_id()],
    ))
}

fn attention_io(node: &fb::XNode<'_>) -> Option<NodeIo> {
    let n = node.xnode_union_as_xnnscaled_dot_product_attention()?;
    let inputs = [
        n.query_id(),
        n.key_id(),
        n.value_id(),
        n.scale_id(),
        n.mask_id(),
    ];
    Some(NodeIo::new(&inputs, &[n.output_id()]))
}

/// [`Io`]s for node kinds whose tables of their own have one `input_id` and one `output_id`.
macro_rules! input_to_output {
    ($($name:ident: $table:ident),* $(,)?) => {$(
        fn $name(node: &fb::XNode<'_>) -> Option<NodeIo> {
            let n = node.$table()?;
            Some(NodeIo::new(&[n.input_id()], &[n.output_id()]))
        }
    )*};
}

input_to_output! {
    static_reshape_io: xnode_union_as_xnnstatic_reshape,
    static_transpose_io: xnode_union_as_xnnstatic_transpose,
    static_slice_io: xnode_union_as_xnnstatic_slice,
    constant_pad_io: xnode_union_as_xnnstatic_constant_pad,
    resize_bilinear_io: xnode_union_as_xnnstatic_resize_bilinear_2_d,
    leaky_relu_io: xnode_union_as_xnnleaky_re_lu,
    elu_io: xnode_union_as_xnnelu,
}

/// A node that packs no operand through the weights cache.
fn nothing_packed(_node: &fb::XNode<'_>) -> Option<u32> {
    None
}

/// A fully connected node's filter.
fn fully_connected_filter(node: &fb::XNode<'_>) -> Option<u32> {
    Some(node.xnode_union_as_xnnfully_connected()?.filter_id())
}

/// A 2-D convolution's filter, unless it has one input channel per group: XNNPACK runs that as
/// a depthwise convolution, which reads its filter as it is.
fn convolution_filter(node: &fb::XNode<'_>) -> Option<u32> {
    let c = node.xnode_union_as_xnnconv_2d()?;
    (c.groups() <= 1 || c.group_input_channels() != 1).then(|| c.filter_id())
}

/// A fully connected node: its flags shape the packing (a transposed filter).
fn fully_connected_packing(node: &fb::XNode<'_>, parameters: &mut Description) -> Option<Packing> {
    let fc = node.xnode_union_as_xnnfully_connected()?;
    parameters.number("flags", fc.flags() as u64);
    Some(Packing {
        input: fc.input1_id(),
        filter: fc.filter_id(),
        bias: fc.bias_id(),
        output: fc.output_id(),
    })
}

/// A 2-D, depthwise or transposed convolution: what may shape the packing (a transposed
/// convolution's is laid out by its strides); only the padding never does.
fn convolution_packing(node: &fb::XNode<'_>, parameters: &mut Description) -> Option<Packing> {
    let c = convolution(node)?;
    parameters.numbers(
        "conv",
        &[
            c.kernel_height(),
            c.kernel_width(),
            c.subsampling_height(),
            c.subsampling_width(),
            c.dilation_height(),
            c.dilation_width(),
            c.adjustment_height(),
            c.adjustment_width(),
            c.groups(),
            c.group_input_channels(),
            c.group_output_channels(),
            c.flags(),
        ]
        .map(u64::from),
    );
    Some(Packing {
        input: c.input1_id(),
        filter: c.filter_id(),
        bias: c.bias_id(),
        output: c.output_id(),
    })
}

/// A batch matrix multiply packs its second input when that is constant; it has no bias.
fn batch_matrix_multiply_packing(
    node: &fb::XNode<'_>,
    parameters: &mut Description,
) -> Option<Packing> {
    let b = node.xnode_union_as_xnnbatch_matrix_multiply()?;
    parameters.number("flags", b.flags() as u64);
    Some(Packing {
        input: b.input1_id(),
        filter: b.input2_id(),
        bias: NO_VALUE,
        output: b.output_id(),
    })
}

/// How a supported node packs a constant operand, if it may: its row's [`PackingOf`], which
/// writes the node's own packing parameters into `parameters`.
pub(super) fn packing(node: &fb::XNode<'_>, parameters: &mut Description) -> Option<Packing> {
    (find(node.xnode_union_type())?.packing?)(node, parameters)
}

/// Whether a node of type `kind` may pack a constant operand through the weights cache (a row
/// with a [`PackingOf`]: fully connected layers, convolutions, batch matrix multiplies; each
/// describes a packing for every node of its type). XNNPACK asks a weights cache of nothing
/// else, so a graph without one never asks it at all.
pub(super) fn may_pack(kind: fb::XNodeUnion) -> bool {
    find(kind).is_some_and(|row| row.packing.is_some())
}

/// The name of every node type of ExecuTorch 1.5.1's XNNPACK schema, in discriminant order.
pub fn schema_node_types() -> impl Iterator<Item = &'static str> {
    fb::XNodeUnion::ENUM_VALUES
        .iter()
        .filter(|k| **k != fb::XNodeUnion::NONE)
        .filter_map(|k| k.variant_name())
}

/// Whether the node named `node` in ExecuTorch's XNNPACK schema is supported.
pub fn is_supported(node: &str) -> bool {
    OPERATORS.iter().any(|o| o.node == node)
}

/// The payload ids of the operands XNNPACK reads only to pack them through the weights cache,
/// after a look-up keyed by their address: each row's [`Packs`], the filters of fully connected
/// and convolution nodes. Biases are left out: for dynamically quantized inputs XNNPACK packs
/// the bias without it being part of the look-up key. Whether another node also reads one as it
/// is, [`define_nodes`] tells.
pub(crate) fn packed_operands(graph: &fb::XNNGraph<'_>) -> FastSet<u32> {
    graph
        .xnodes()
        .iter()
        .flatten()
        .filter_map(|node| (find(node.xnode_union_type())?.packs)(&node))
        .collect()
}

/// Defines every node of the graph (checked against the table before anything was loaded)
/// but those in `skipped`, by ascending index (reshapes folded into their inputs' binding).
/// Returns the payload ids of the operands some node may read as they are (not only to pack).
pub(super) fn define_nodes(
    g: &mut Subgraph<'_>,
    graph: &fb::XNNGraph<'_>,
    io: &GraphIo,
    ids: &ById<u32>,
    skipped: &[usize],
) -> Result<ById<()>, DelegateError> {
    let qb4w = qb4w_gemm_inputs(graph, io, |filter| {
        ids.get(filter).and_then(|&id| g.datatype(id)) == Some(crate::xnn::Datatype::Qbint4)
    });
    // One set for every node (a set per node, merged, was most of the nodes' definition).
    let read_as_is = RefCell::new(ById::like(ids));
    let mut skipped = skipped.iter().peekable();
    for (index, node) in graph.xnodes().iter().flatten().enumerate() {
        if skipped.next_if_eq(&&index).is_some() {
            continue;
        }
        define_node(g, index, &node, ids, &qb4w, &read_as_is)?;
    }
    Ok(read_as_is.into_inner())
}

/// The payload ids of the values read only by fully connected nodes with 4-bit blockwise
/// weights (`is_qb4w` of their filter), as their input. A conversion from fp32 writing one of
/// them lays it out for XNNPACK's qp8 GEMMs where it has them
/// ([`Subgraph::define_convert_for_qb4w_gemm`]): KleidiAI's on aarch64, which run a prompt's
/// rows in tiles of 16 on i8mm. ExecuTorch's backend asks its XNNPACK for the same of a
/// conversion one of whose readers is such a node; this asks it only where every reader is,
/// since this XNNPACK's GEMMs for other weights do not read qpint8.
pub(crate) fn qb4w_gemm_inputs(
    graph: &fb::XNNGraph<'_>,
    io: &GraphIo,
    is_qb4w: impl Fn(u32) -> bool,
) -> FastSet<u32> {
    fn qb4w_fully_connected<'g>(
        node: fb::XNode<'g>,
        is_qb4w: &impl Fn(u32) -> bool,
    ) -> Option<fb::XNNFullyConnected<'g>> {
        node.xnode_union_as_xnnfully_connected()
            .filter(|fc| is_qb4w(fc.filter_id()))
    }
    // Most graphs have no such node: then nothing else is asked of their nodes' reads.
    if !graph
        .xnodes()
        .iter()
        .flatten()
        .any(|node| qb4w_fully_connected(node, &is_qb4w).is_some())
    {
        return FastSet::default();
    }
    let mut qb4w = FastSet::default();
    let mut other = FastSet::default();
    for (n, node) in graph.xnodes().iter().flatten().enumerate() {
        let Some((reads, _)) = io.node(n) else {
            continue;
        };
        let fc = qb4w_fully_connected(node, &is_qb4w);
        for &read in reads {
            match fc {
                Some(fc) if read == fc.input1_id() => qb4w.insert(read),
                _ => other.insert(read),
            };
        }
    }
    qb4w.retain(|id| !other.contains(id));
    qb4w
}

/// Defines node `index` of the graph, whose payload value ids `ids` maps to subgraph ids
/// (`qb4w_gemm_inputs`: the graph's [`qb4w_gemm_inputs`]). Adds to `read_as_is` the payload
/// ids of the operands it may read as they are (not only to pack).
pub(super) fn define_node(
    g: &mut Subgraph<'_>,
    index: usize,
    node: &fb::XNode<'_>,
    ids: &ById<u32>,
    qb4w_gemm_inputs: &FastSet<u32>,
    read_as_is: &RefCell<ById<()>>,
) -> Result<(), DelegateError> {
    let kind = node.xnode_union_type();
    let op = find(kind).ok_or_else(|| DelegateError::UnsupportedNode {
        index,
        name: kind
            .variant_name()
            .map_or_else(|| format!("node type {}", kind.0), str::to_string),
    })?;
    let cx = Node {
        index,
        name: op.node,
        ids,
        read_as_is,
        qb4w_gemm_inputs,
    };
    (op.define)(g, node, &cx)
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
