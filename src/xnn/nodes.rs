//! The node kinds of ExecuTorch's XNNPACK schema beyond matrix products and convolutions:
//! element-wise unary and binary operators, pooling, transposed convolution, padding, resizing,
//! concatenation of up to five inputs, PReLU and scaled dot-product attention. Each checks what
//! XNNPACK would read past (array lengths, ranks, channel counts) before the call.

use super::convolutions::Padding2d;
use super::error::{XnnError, check};
use super::subgraph::{Subgraph, refuse};
use xnnpack_sys as sys;

/// An element-wise operator of one input (`xnn_define_unary`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    /// `|x|`.
    Abs,
    /// Rounds up.
    Ceiling,
    /// `min(max(x, min), max)`.
    Clamp {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// `x` for positive `x`, else `alpha * (exp(x) - 1)`.
    Elu {
        /// The scale of the negative part.
        alpha: f32,
    },
    /// `e^x`.
    Exp,
    /// Rounds down.
    Floor,
    /// The Gaussian error linear unit.
    Gelu,
    /// `x * relu6(x + 3) / 6`.
    Hardswish,
    /// `x` for positive `x`, else `negative_slope * x`.
    LeakyRelu {
        /// The slope of the negative part.
        negative_slope: f32,
    },
    /// The natural logarithm.
    Log,
    /// `-x`.
    Negate,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `x * x`.
    Square,
    /// `sqrt(x)`.
    SquareRoot,
    /// `1 / sqrt(x)`.
    ReciprocalSquareRoot,
    /// The hyperbolic tangent.
    Tanh,
    /// The sine.
    Sine,
    /// The cosine.
    Cosine,
}

impl UnaryOp {
    fn raw(self) -> (sys::xnn_unary_operator, sys::xnn_unary_params) {
        let mut params = sys::xnn_unary_params::default();
        let op = match self {
            UnaryOp::Abs => sys::xnn_unary_abs,
            UnaryOp::Ceiling => sys::xnn_unary_ceiling,
            UnaryOp::Clamp { min, max } => {
                params.clamp.min = min;
                params.clamp.max = max;
                sys::xnn_unary_clamp
            }
            UnaryOp::Elu { alpha } => {
                params.elu.alpha = alpha;
                sys::xnn_unary_elu
            }
            UnaryOp::Exp => sys::xnn_unary_exp,
            UnaryOp::Floor => sys::xnn_unary_floor,
            UnaryOp::Gelu => sys::xnn_unary_gelu,
            UnaryOp::Hardswish => sys::xnn_unary_hardswish,
            UnaryOp::LeakyRelu { negative_slope } => {
                params.leaky_relu.negative_slope = negative_slope;
                sys::xnn_unary_leaky_relu
            }
            UnaryOp::Log => sys::xnn_unary_log,
            UnaryOp::Negate => sys::xnn_unary_negate,
            UnaryOp::Sigmoid => sys::xnn_unary_sigmoid,
            UnaryOp::Square => sys::xnn_unary_square,
            UnaryOp::SquareRoot => sys::xnn_unary_square_root,
            UnaryOp::ReciprocalSquareRoot => sys::xnn_unary_reciprocal_square_root,
            UnaryOp::Tanh => sys::xnn_unary_tanh,
            UnaryOp::Sine => sys::xnn_unary_sine,
            UnaryOp::Cosine => sys::xnn_unary_cosine,
        };
        (op, params)
    }
}

/// An element-wise operator of two inputs with numpy-style broadcasting (`xnn_define_binary`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Subtract,
    /// `a * b`.
    Multiply,
    /// `a / b`.
    Divide,
    /// `min(a, b)`.
    Minimum,
    /// `max(a, b)`.
    Maximum,
}

impl BinaryOp {
    fn raw(self) -> sys::xnn_binary_operator {
        match self {
            BinaryOp::Add => sys::xnn_binary_add,
            BinaryOp::Subtract => sys::xnn_binary_subtract,
            BinaryOp::Multiply => sys::xnn_binary_multiply,
            BinaryOp::Divide => sys::xnn_binary_divide,
            BinaryOp::Minimum => sys::xnn_binary_minimum,
            BinaryOp::Maximum => sys::xnn_binary_maximum,
        }
    }
}

/// A 2-D pooling window over NHWC input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pooling2dParams {
    /// Implicit padding around the input.
    pub padding: Padding2d,
    /// Window height.
    pub pooling_height: u32,
    /// Window width.
    pub pooling_width: u32,
    /// Step between windows along the height.
    pub stride_height: u32,
    /// Step between windows along the width.
    pub stride_width: u32,
    /// Distance between window rows (max pooling only; 1 is none).
    pub dilation_height: u32,
    /// Distance between window columns (max pooling only; 1 is none).
    pub dilation_width: u32,
    /// Lower bound the output is clamped to.
    pub output_min: f32,
    /// Upper bound the output is clamped to.
    pub output_max: f32,
    /// XNNPACK's node flags (`XNN_FLAG_KEEP_DIMS`, `XNN_FLAG_TENSORFLOW_SAME_PADDING`).
    pub flags: u32,
}

/// A 2-D transposed convolution (`xnn_define_deconvolution_2d`) over NHWC input, with a filter
/// of shape [groups * group_output_channels, kernel_height, kernel_width, group_input_channels].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deconvolution2dParams {
    /// Rows and columns cropped from the full output.
    pub padding: Padding2d,
    /// Extra output rows at the bottom.
    pub adjustment_height: u32,
    /// Extra output columns at the right.
    pub adjustment_width: u32,
    /// Filter height.
    pub kernel_height: u32,
    /// Filter width.
    pub kernel_width: u32,
    /// Output rows per input row.
    pub upsampling_height: u32,
    /// Output columns per input column.
    pub upsampling_width: u32,
    /// Distance between filter rows (1 is none).
    pub dilation_height: u32,
    /// Distance between filter columns (1 is none).
    pub dilation_width: u32,
    /// Channel groups.
    pub groups: u32,
    /// Input channels per group.
    pub group_input_channels: usize,
    /// Output channels per group.
    pub group_output_channels: usize,
    /// Lower bound the output is clamped to.
    pub output_min: f32,
    /// Upper bound the output is clamped to.
    pub output_max: f32,
}

/// Known dimensions of `id` with rank `rank`, or a refusal naming `call`.
fn ranked<'a>(
    g: &'a Subgraph<'_>,
    id: u32,
    rank: usize,
    call: &'static str,
) -> Result<&'a [usize], XnnError> {
    match g.dims(id) {
        Some(d) if d.len() == rank => Ok(d),
        _ => Err(refuse(call)),
    }
}

impl Subgraph<'_> {
    /// Defines `output = op(input)` elementwise.
    pub fn define_unary(&mut self, op: UnaryOp, input: u32, output: u32) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_unary")?;
        let (op, params) = op.raw();
        // SAFETY: `params` lives across the call, which copies it; XNNPACK validates the ids.
        check("xnn_define_unary", unsafe {
            sys::xnn_define_unary(self.as_raw(), op, &params, input, output, 0)
        })
    }

    /// Defines `output = op(input1, input2)` elementwise with broadcasting, clamped to
    /// `[min, max]` when `clamp` is given (XNNPACK adds a clamp node for it).
    pub fn define_binary_op(
        &mut self,
        op: BinaryOp,
        clamp: Option<(f32, f32)>,
        input1: u32,
        input2: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_binary")?;
        let params = clamp.map(|(min, max)| sys::xnn_binary_params {
            output_min: min.into(),
            output_max: max.into(),
        });
        let params_ptr = params
            .as_ref()
            .map_or(std::ptr::null(), |p| p as *const sys::xnn_binary_params);
        // SAFETY: the parameters are null or live across the call; XNNPACK validates the ids.
        check("xnn_define_binary", unsafe {
            sys::xnn_define_binary(
                self.as_raw(),
                op.raw(),
                params_ptr,
                input1,
                input2,
                output,
                0,
            )
        })
    }

    /// Defines max pooling of a 4-D NHWC `input`.
    pub fn define_max_pooling_2d(
        &mut self,
        p: &Pooling2dParams,
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_max_pooling_2d";
        ranked(self, input, 4, call)?;
        self.writable(output, call)?;
        // SAFETY: plain values; XNNPACK validates the window, the flags and the ids.
        check(call, unsafe {
            sys::xnn_define_max_pooling_2d(
                self.as_raw(),
                p.padding.top,
                p.padding.right,
                p.padding.bottom,
                p.padding.left,
                p.pooling_height,
                p.pooling_width,
                p.stride_height,
                p.stride_width,
                p.dilation_height,
                p.dilation_width,
                p.output_min,
                p.output_max,
                input,
                output,
                p.flags,
            )
        })
    }

    /// Defines average pooling of a 4-D NHWC `input` (the dilations are not used).
    pub fn define_average_pooling_2d(
        &mut self,
        p: &Pooling2dParams,
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_average_pooling_2d";
        ranked(self, input, 4, call)?;
        self.writable(output, call)?;
        // SAFETY: plain values; XNNPACK validates the window, the flags and the ids.
        check(call, unsafe {
            sys::xnn_define_average_pooling_2d(
                self.as_raw(),
                p.padding.top,
                p.padding.right,
                p.padding.bottom,
                p.padding.left,
                p.pooling_height,
                p.pooling_width,
                p.stride_height,
                p.stride_width,
                p.output_min,
                p.output_max,
                input,
                output,
                p.flags,
            )
        })
    }

    /// Defines argmax pooling (stride = window) of a 4-D NHWC `input`: the maxima and their
    /// index within each window.
    #[allow(clippy::too_many_arguments)]
    pub fn define_argmax_pooling_2d(
        &mut self,
        padding: Padding2d,
        pooling_height: u32,
        pooling_width: u32,
        input: u32,
        output_value: u32,
        output_index: u32,
        flags: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_argmax_pooling_2d";
        ranked(self, input, 4, call)?;
        self.writable(output_value, call)?;
        self.writable(output_index, call)?;
        // SAFETY: plain values; XNNPACK validates the window, the flags and the ids.
        check(call, unsafe {
            sys::xnn_define_argmax_pooling_2d(
                self.as_raw(),
                padding.top,
                padding.right,
                padding.bottom,
                padding.left,
                pooling_height,
                pooling_width,
                input,
                output_value,
                output_index,
                flags,
            )
        })
    }

    /// Defines a transposed convolution of a 4-D NHWC `input` whose channels are
    /// `groups * group_input_channels`.
    pub fn define_deconvolution_2d(
        &mut self,
        p: &Deconvolution2dParams,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_deconvolution_2d";
        let groups = p.groups as usize;
        let in_channels = groups.checked_mul(p.group_input_channels);
        let out_channels = groups.checked_mul(p.group_output_channels);
        // The operator strides through rows of the input and output by the channel counts it
        // was created with: tensors of other widths would be read or written past their end.
        let input_ok = ranked(self, input, 4, call)?.last().copied() == in_channels;
        let filter_dims = ranked(self, filter, 4, call)?;
        let filter_ok = Some(filter_dims[0]) == out_channels
            && filter_dims[1] == p.kernel_height as usize
            && filter_dims[2] == p.kernel_width as usize
            && filter_dims[3] == p.group_input_channels;
        let output_ok = ranked(self, output, 4, call)?.last().copied() == out_channels;
        let bias_ok = match bias {
            Some(b) => self.dims(b).map(|d| d.iter().product::<usize>()) == out_channels,
            None => true,
        };
        if !(input_ok && filter_ok && output_ok && bias_ok) {
            return Err(refuse(call));
        }
        self.writable(output, call)?;
        // SAFETY: plain values; the channel counts match the tensors (checked above) and
        // XNNPACK validates the rest.
        check(call, unsafe {
            sys::xnn_define_deconvolution_2d(
                self.as_raw(),
                p.padding.top,
                p.padding.right,
                p.padding.bottom,
                p.padding.left,
                p.adjustment_height,
                p.adjustment_width,
                p.kernel_height,
                p.kernel_width,
                p.upsampling_height,
                p.upsampling_width,
                p.dilation_height,
                p.dilation_width,
                p.groups,
                p.group_input_channels,
                p.group_output_channels,
                p.output_min,
                p.output_max,
                input,
                filter,
                bias.unwrap_or(sys::XNN_INVALID_VALUE_ID),
                output,
                0,
            )
        })
    }

    /// Defines `output = input` padded with `value`: `pre[i]` and `post[i]` elements before and
    /// after dimension `i`, one entry per dimension of the input.
    pub fn define_static_constant_pad(
        &mut self,
        pre: &[usize],
        post: &[usize],
        value: f32,
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_static_constant_pad";
        // XNNPACK reads as many paddings as the input has dimensions.
        let rank = self.dims(input).map(<[usize]>::len);
        if rank != Some(pre.len()) || rank != Some(post.len()) {
            return Err(refuse(call));
        }
        self.writable(output, call)?;
        // SAFETY: both arrays hold one entry per input dimension (checked above) and are read
        // during the call only; XNNPACK validates the ids.
        check(call, unsafe {
            sys::xnn_define_static_constant_pad(
                self.as_raw(),
                pre.as_ptr(),
                post.as_ptr(),
                value,
                input,
                output,
                0,
            )
        })
    }

    /// Defines a bilinear resize of a 4-D NHWC `input` to `new_height` x `new_width`
    /// (`flags`: `XNN_FLAG_ALIGN_CORNERS`, `XNN_FLAG_TENSORFLOW_LEGACY_MODE`).
    pub fn define_static_resize_bilinear_2d(
        &mut self,
        new_height: usize,
        new_width: usize,
        input: u32,
        output: u32,
        flags: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_static_resize_bilinear_2d";
        ranked(self, input, 4, call)?;
        self.writable(output, call)?;
        // SAFETY: plain values; XNNPACK validates the size, the flags and the ids.
        check(call, unsafe {
            sys::xnn_define_static_resize_bilinear_2d(
                self.as_raw(),
                new_height,
                new_width,
                input,
                output,
                flags,
            )
        })
    }

    /// Defines `output = concat(inputs)` along `axis`, for 2 to 5 inputs.
    pub fn define_concatenate(
        &mut self,
        axis: i32,
        inputs: &[u32],
        output: u32,
    ) -> Result<(), XnnError> {
        let g = self.as_raw();
        let (call, status) = match *inputs {
            [a, b] => return self.define_concatenate2(axis, a, b, output),
            [a, b, c] => {
                self.writable(output, "xnn_define_concatenate3")?;
                // SAFETY: plain values; XNNPACK validates the axis and the ids.
                ("xnn_define_concatenate3", unsafe {
                    sys::xnn_define_concatenate3(g, axis, a, b, c, output, 0)
                })
            }
            [a, b, c, d] => {
                self.writable(output, "xnn_define_concatenate4")?;
                // SAFETY: as above.
                ("xnn_define_concatenate4", unsafe {
                    sys::xnn_define_concatenate4(g, axis, a, b, c, d, output, 0)
                })
            }
            [a, b, c, d, e] => {
                self.writable(output, "xnn_define_concatenate5")?;
                // SAFETY: as above.
                ("xnn_define_concatenate5", unsafe {
                    sys::xnn_define_concatenate5(g, axis, a, b, c, d, e, output, 0)
                })
            }
            _ => return Err(refuse("xnn_define_concatenate")),
        };
        check(call, status)
    }

    /// Defines `output = input` where positive, `slope * input` elsewhere, with one slope per
    /// channel (the input's last dimension).
    pub fn define_prelu(&mut self, input: u32, slope: u32, output: u32) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_prelu")?;
        // SAFETY: plain values; XNNPACK validates the ids and shapes.
        #[allow(deprecated)]
        check("xnn_define_prelu", unsafe {
            sys::xnn_define_prelu(self.as_raw(), input, slope, output, 0)
        })
    }

    /// Defines `output = softmax(query · keyᵀ · scale + mask) · value` (no logits cap), with
    /// query \[.., T, C\], key and value \[.., S, C\], scale \[C\] and mask \[T, S\].
    pub fn define_scaled_dot_product_attention(
        &mut self,
        query: u32,
        key: u32,
        value: u32,
        scale: u32,
        mask: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        let call = "xnn_define_scaled_dot_product_attention";
        self.writable(output, call)?;
        // SAFETY: no cap parameters with cap type none; XNNPACK validates the ids and shapes.
        check(call, unsafe {
            sys::xnn_define_scaled_dot_product_attention(
                self.as_raw(),
                sys::xnn_attention_logits_cap_type_none,
                std::ptr::null(),
                query,
                key,
                value,
                scale,
                mask,
                output,
                0,
            )
        })
    }
}
