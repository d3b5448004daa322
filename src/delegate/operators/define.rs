//! How each supported node is defined in XNNPACK's subgraph: the rows' `define` functions of
//! [`OPERATORS`](super::OPERATORS).

use super::{Node, concatenation, one_to_one, pooling, two_to_one};
use crate::delegate::error::{DelegateError, at};
use crate::schema::xnn as fb;
use crate::xnn::{
    BinaryOp, Convolution2dParams, Deconvolution2dParams, DepthwiseConvolution2dParams,
    FullyConnectedFlags, Padding2d, Pooling2dParams, Subgraph, UnaryOp,
};

pub(super) fn min_max(node: &fb::XNode<'_>) -> (f32, f32) {
    node.output_min_max()
        .map_or((f32::NEG_INFINITY, f32::INFINITY), |m| {
            (m.output_min(), m.output_max())
        })
}

pub(super) fn malformed(cx: &Node<'_>) -> DelegateError {
    DelegateError::BadGraph(format!(
        "node {}: not the {} its type says",
        cx.index, cx.name
    ))
}

pub(super) fn fully_connected(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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
pub(super) fn convolution_parts<'g>(
    node: &fb::XNode<'g>,
    cx: &Node<'_>,
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

pub(super) fn padding(c: &fb::_XNNNodeConv<'_>) -> Padding2d {
    Padding2d {
        top: c.padding_top(),
        right: c.padding_right(),
        bottom: c.padding_bottom(),
        left: c.padding_left(),
    }
}

pub(super) fn convolution_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

pub(super) fn depthwise_convolution_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

/// Refuses node flags XNNPACK is not given for this node kind (none, unless `allowed` says).
pub(super) fn no_flags(cx: &Node<'_>, flags: u32, allowed: u32) -> Result<u32, DelegateError> {
    if flags & !allowed != 0 {
        return Err(DelegateError::BadGraph(format!(
            "node {} ({}): unsupported flags {flags:#x}",
            cx.index, cx.name
        )));
    }
    Ok(flags)
}

/// An element-wise binary node: add, subtract, multiply and divide are clamped to the node's
/// output min/max, minimum and maximum are not (as ExecuTorch defines them).
pub(super) fn binary(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
    op: BinaryOp,
) -> Result<(), DelegateError> {
    let b = two_to_one(node).ok_or_else(|| malformed(cx))?;
    no_flags(cx, b.flags(), 0)?;
    let clamp = match op {
        BinaryOp::Minimum | BinaryOp::Maximum => None,
        _ => Some(min_max(node)),
    };
    g.define_binary_op(
        op,
        clamp,
        cx.id(b.input1_id())?,
        cx.id(b.input2_id())?,
        cx.id(b.output_id())?,
    )
    .map_err(at(cx.what()))
}

/// An element-wise unary node without parameters.
pub(super) fn unary(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
    op: UnaryOp,
) -> Result<(), DelegateError> {
    let u = one_to_one(node).ok_or_else(|| malformed(cx))?;
    no_flags(cx, u.flags(), 0)?;
    g.define_unary(op, cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

/// One definition function per element-wise node kind, for the table.
macro_rules! elementwise {
    ($($name:ident: $how:ident($op:expr_2021);)*) => {
        $(
            pub(super) fn $name(
                g: &mut Subgraph<'_>,
                node: &fb::XNode<'_>,
                cx: &Node<'_>,
            ) -> Result<(), DelegateError> {
                $how(g, node, cx, $op)
            }
        )*
    };
}

elementwise! {
    add: binary(BinaryOp::Add);
    subtract: binary(BinaryOp::Subtract);
    multiply: binary(BinaryOp::Multiply);
    divide: binary(BinaryOp::Divide);
    minimum: binary(BinaryOp::Minimum);
    maximum: binary(BinaryOp::Maximum);
    abs: unary(UnaryOp::Abs);
    ceiling: unary(UnaryOp::Ceiling);
    exp: unary(UnaryOp::Exp);
    floor: unary(UnaryOp::Floor);
    gelu: unary(UnaryOp::Gelu);
    hardswish: unary(UnaryOp::Hardswish);
    log: unary(UnaryOp::Log);
    negate: unary(UnaryOp::Negate);
    reciprocal_square_root: unary(UnaryOp::ReciprocalSquareRoot);
    sigmoid: unary(UnaryOp::Sigmoid);
    sine: unary(UnaryOp::Sine);
    cosine: unary(UnaryOp::Cosine);
    square: unary(UnaryOp::Square);
    square_root: unary(UnaryOp::SquareRoot);
    tanh: unary(UnaryOp::Tanh);
}

pub(super) fn leaky_relu(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnleaky_re_lu()
        .ok_or_else(|| malformed(cx))?;
    no_flags(cx, u.flags(), 0)?;
    let op = UnaryOp::LeakyRelu {
        negative_slope: u.negative_slope(),
    };
    g.define_unary(op, cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

pub(super) fn elu(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let u = node.xnode_union_as_xnnelu().ok_or_else(|| malformed(cx))?;
    no_flags(cx, u.flags(), 0)?;
    let op = UnaryOp::Elu { alpha: u.alpha() };
    g.define_unary(op, cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

pub(super) fn prelu(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let b = node
        .xnode_union_as_xnnpre_lu()
        .ok_or_else(|| malformed(cx))?;
    no_flags(cx, b.flags(), 0)?;
    g.define_prelu(
        cx.id(b.input1_id())?,
        cx.id(b.input2_id())?,
        cx.id(b.output_id())?,
    )
    .map_err(at(cx.what()))
}

/// Pooling flags ExecuTorch writes (keep dims) and XNNPACK's same-padding.
pub(super) const POOLING_FLAGS: u32 =
    xnnpack_sys::XNN_FLAG_KEEP_DIMS | xnnpack_sys::XNN_FLAG_TENSORFLOW_SAME_PADDING;

pub(super) fn pooling_params(
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(Pooling2dParams, u32, u32), DelegateError> {
    let p = pooling(node).ok_or_else(|| malformed(cx))?;
    let (output_min, output_max) = min_max(node);
    let params = Pooling2dParams {
        padding: Padding2d {
            top: p.padding_top(),
            right: p.padding_right(),
            bottom: p.padding_bottom(),
            left: p.padding_left(),
        },
        pooling_height: p.pooling_height(),
        pooling_width: p.pooling_width(),
        stride_height: p.stride_height(),
        stride_width: p.stride_width(),
        dilation_height: p.dilation_height(),
        dilation_width: p.dilation_width(),
        output_min,
        output_max,
        flags: no_flags(cx, p.flags(), POOLING_FLAGS)?,
    };
    Ok((params, p.input_id(), p.output_id()))
}

pub(super) fn max_pooling_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let (p, input, output) = pooling_params(node, cx)?;
    g.define_max_pooling_2d(&p, cx.id(input)?, cx.id(output)?)
        .map_err(at(cx.what()))
}

pub(super) fn average_pooling_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let (p, input, output) = pooling_params(node, cx)?;
    g.define_average_pooling_2d(&p, cx.id(input)?, cx.id(output)?)
        .map_err(at(cx.what()))
}

pub(super) fn argmax_pooling_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let a = node
        .xnode_union_as_xnnarg_max_pooling_2d()
        .ok_or_else(|| malformed(cx))?;
    let padding = Padding2d {
        top: a.padding_top(),
        right: a.padding_right(),
        bottom: a.padding_bottom(),
        left: a.padding_left(),
    };
    g.define_argmax_pooling_2d(
        padding,
        a.pooling_height(),
        a.pooling_width(),
        cx.id(a.input_id())?,
        cx.id(a.output_value_id())?,
        cx.id(a.output_index_id())?,
        no_flags(cx, a.flags(), POOLING_FLAGS)?,
    )
    .map_err(at(cx.what()))
}

pub(super) fn deconvolution_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let c = node
        .xnode_union_as_xnnconv_transpose_2d()
        .ok_or_else(|| malformed(cx))?;
    no_flags(cx, c.flags(), 0)?;
    let (output_min, output_max) = min_max(node);
    let p = Deconvolution2dParams {
        padding: padding(&c),
        adjustment_height: c.adjustment_height(),
        adjustment_width: c.adjustment_width(),
        kernel_height: c.kernel_height(),
        kernel_width: c.kernel_width(),
        upsampling_height: c.subsampling_height(),
        upsampling_width: c.subsampling_width(),
        dilation_height: c.dilation_height(),
        dilation_width: c.dilation_width(),
        groups: c.groups(),
        group_input_channels: c.group_input_channels() as usize,
        group_output_channels: c.group_output_channels() as usize,
        output_min,
        output_max,
    };
    // The filter is read as it is: XNNPACK's deconvolution packs it without the weights cache
    // in this build, so it cannot be deferred.
    g.define_deconvolution_2d(
        &p,
        cx.id(c.input1_id())?,
        cx.id(c.filter_id())?,
        cx.optional(c.bias_id())?,
        cx.id(c.output_id())?,
    )
    .map_err(at(cx.what()))
}

pub(super) fn static_constant_pad(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let p = node
        .xnode_union_as_xnnstatic_constant_pad()
        .ok_or_else(|| malformed(cx))?;
    no_flags(cx, p.flags(), 0)?;
    if p.pre_paddings().is_none() || p.post_paddings().is_none() {
        return Err(DelegateError::BadGraph(format!(
            "node {}: a constant pad without its paddings",
            cx.index
        )));
    }
    g.define_static_constant_pad(
        &usizes(p.pre_paddings()),
        &usizes(p.post_paddings()),
        p.padding_value(),
        cx.id(p.input_id())?,
        cx.id(p.output_id())?,
    )
    .map_err(at(cx.what()))
}

pub(super) fn static_resize_bilinear_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let r = node
        .xnode_union_as_xnnstatic_resize_bilinear_2_d()
        .ok_or_else(|| malformed(cx))?;
    let allowed =
        xnnpack_sys::XNN_FLAG_ALIGN_CORNERS | xnnpack_sys::XNN_FLAG_TENSORFLOW_LEGACY_MODE;
    g.define_static_resize_bilinear_2d(
        r.new_height() as usize,
        r.new_width() as usize,
        cx.id(r.input_id())?,
        cx.id(r.output_id())?,
        no_flags(cx, r.flags(), allowed)?,
    )
    .map_err(at(cx.what()))
}

pub(super) fn copy(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let u = node.xnode_union_as_xnncopy().ok_or_else(|| malformed(cx))?;
    no_flags(cx, u.flags(), 0)?;
    g.define_copy(cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

pub(super) fn scaled_dot_product_attention(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let a = node
        .xnode_union_as_xnnscaled_dot_product_attention()
        .ok_or_else(|| malformed(cx))?;
    no_flags(cx, a.flags(), 0)?;
    g.define_scaled_dot_product_attention(
        cx.id(a.query_id())?,
        cx.id(a.key_id())?,
        cx.id(a.value_id())?,
        cx.id(a.scale_id())?,
        cx.id(a.mask_id())?,
        cx.id(a.output_id())?,
    )
    .map_err(at(cx.what()))
}

pub(super) fn batch_matrix_multiply(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

pub(super) fn clamp(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnclamp()
        .ok_or_else(|| malformed(cx))?;
    let (min, max) = min_max(node);
    g.define_clamp(cx.id(u.input_id())?, cx.id(u.output_id())?, min, max)
        .map_err(at(cx.what()))
}

pub(super) fn softmax(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnsoftmax()
        .ok_or_else(|| malformed(cx))?;
    g.define_softmax(cx.id(u.input_id())?, cx.id(u.output_id())?)
        .map_err(at(cx.what()))
}

pub(super) fn convert(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let u = node
        .xnode_union_as_xnnconvert()
        .ok_or_else(|| malformed(cx))?;
    let (input, output) = (cx.id(u.input_id())?, cx.id(u.output_id())?);
    // Between fp32 and fp16, both sides are fp32 where fp16 is computed as fp32
    // (super::fallback); XNNPACK has no fp32 to fp32 convert, and a copy is the same.
    // (A quantized type to itself is a requantization, left to XNNPACK.)
    let fp32 = Some(crate::xnn::Datatype::Fp32);
    if g.datatype(input) == fp32 && g.datatype(output) == fp32 {
        g.define_copy(input, output)
    } else if g.datatype(input) == fp32 && cx.qb4w_gemm_inputs.contains(&u.output_id()) {
        g.define_convert_for_qb4w_gemm(input, output)
    } else {
        g.define_convert(input, output)
    }
    .map_err(at(cx.what()))
}

pub(super) fn global_average_pooling_2d(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

pub(super) fn usizes(v: Option<flatbuffers::Vector<'_, u32>>) -> Vec<usize> {
    v.map(|s| s.iter().map(|x| x as usize).collect())
        .unwrap_or_default()
}

pub(super) fn static_reshape(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

pub(super) fn static_transpose(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

pub(super) fn static_slice(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
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

pub(super) fn concatenate(
    g: &mut Subgraph<'_>,
    node: &fb::XNode<'_>,
    cx: &Node<'_>,
) -> Result<(), DelegateError> {
    let (c, inputs) = concatenation(node).ok_or_else(|| malformed(cx))?;
    no_flags(cx, c.flags(), 0)?;
    let ids = inputs
        .iter()
        .map(|&i| cx.id(i))
        .collect::<Result<Vec<u32>, _>>()?;
    let axis = i32::try_from(c.axis()).map_err(|_| {
        DelegateError::BadGraph(format!(
            "node {}: axis {} is out of range",
            cx.index,
            c.axis()
        ))
    })?;
    g.define_concatenate(axis, &ids, cx.id(c.output_id())?)
        .map_err(at(cx.what()))
}
