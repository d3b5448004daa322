//! Matrix products and convolutions in a [`Subgraph`]: their parameters, and the wrappers that
//! define them, which refuse a filter or bias of another element count than XNNPACK reads.

use super::datatype::Datatype;
use super::error::{XnnError, check};
use super::subgraph::{Subgraph, elements, refuse};
use xnnpack_sys as sys;

/// Features of a fully connected node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FullyConnectedFlags {
    /// The filter is `[input_channels, output_channels]` instead of
    /// `[output_channels, input_channels]` (`XNN_FLAG_TRANSPOSE_WEIGHTS`).
    pub transpose_weights: bool,
    /// Flatten the input to `[elements / input_channels, input_channels]`
    /// (`XNN_FLAG_TENSORFLOW_RESHAPE_2D`).
    pub reshape_2d: bool,
}

impl FullyConnectedFlags {
    fn to_raw(self) -> u32 {
        let mut flags = 0;
        if self.transpose_weights {
            flags |= sys::XNN_FLAG_TRANSPOSE_WEIGHTS;
        }
        if self.reshape_2d {
            flags |= sys::XNN_FLAG_TENSORFLOW_RESHAPE_2D;
        }
        flags
    }
}

/// Implicit zero padding around the 2-D input of a convolution.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Padding2d {
    /// Rows of zeros above the input (`input_padding_top`).
    pub top: u32,
    /// Columns of zeros right of the input (`input_padding_right`).
    pub right: u32,
    /// Rows of zeros below the input (`input_padding_bottom`).
    pub bottom: u32,
    /// Columns of zeros left of the input (`input_padding_left`).
    pub left: u32,
}

impl Padding2d {
    /// The same padding on all four sides.
    pub fn uniform(padding: u32) -> Padding2d {
        Padding2d {
            top: padding,
            right: padding,
            bottom: padding,
            left: padding,
        }
    }
}

/// The parameters of `xnn_define_convolution_2d`: an NHWC input `[N, H, W, groups *
/// group_input_channels]`, a filter `[groups * group_output_channels, kernel_height,
/// kernel_width, group_input_channels]`, an optional bias `[groups * group_output_channels]`
/// and an output `[N, OH, OW, groups * group_output_channels]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Convolution2dParams {
    /// Must be all zero with `tensorflow_same_padding`.
    pub padding: Padding2d,
    /// Filter height in taps (`kernel_height`).
    pub kernel_height: u32,
    /// Filter width in taps (`kernel_width`).
    pub kernel_width: u32,
    /// Stride along the height (`subsampling_height`).
    pub stride_height: u32,
    /// Stride along the width (`subsampling_width`).
    pub stride_width: u32,
    /// Distance in input rows between filter taps; 1 is no dilation (`dilation_height`).
    pub dilation_height: u32,
    /// Distance in input columns between filter taps; 1 is no dilation (`dilation_width`).
    pub dilation_width: u32,
    /// Groups the channels are split into, each convolved independently; 1 for an ordinary
    /// convolution (`groups`).
    pub groups: u32,
    /// Input channels per group (`group_input_channels`).
    pub group_input_channels: usize,
    /// Output channels per group (`group_output_channels`).
    pub group_output_channels: usize,
    /// Lower bound the output is clamped to.
    pub output_min: f32,
    /// Upper bound the output is clamped to.
    pub output_max: f32,
    /// Pad like TensorFlow's "SAME" (`XNN_FLAG_TENSORFLOW_SAME_PADDING`).
    pub tensorflow_same_padding: bool,
}

impl Convolution2dParams {
    /// One group, stride 1, no dilation, no padding, no clamping.
    pub fn new(
        kernel_height: u32,
        kernel_width: u32,
        input_channels: usize,
        output_channels: usize,
    ) -> Convolution2dParams {
        Convolution2dParams {
            padding: Padding2d::default(),
            kernel_height,
            kernel_width,
            stride_height: 1,
            stride_width: 1,
            dilation_height: 1,
            dilation_width: 1,
            groups: 1,
            group_input_channels: input_channels,
            group_output_channels: output_channels,
            output_min: f32::NEG_INFINITY,
            output_max: f32::INFINITY,
            tensorflow_same_padding: false,
        }
    }
}

/// The parameters of `xnn_define_depthwise_convolution_2d`: an NHWC input `[N, H, W,
/// input_channels]`, a filter `[1, kernel_height, kernel_width, input_channels *
/// depth_multiplier]` (output channel `c * depth_multiplier + m` reads input channel `c`), an
/// optional bias `[input_channels * depth_multiplier]` and an output `[N, OH, OW,
/// input_channels * depth_multiplier]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthwiseConvolution2dParams {
    /// Must be all zero with `tensorflow_same_padding`.
    pub padding: Padding2d,
    /// Filter height in taps (`kernel_height`).
    pub kernel_height: u32,
    /// Filter width in taps (`kernel_width`).
    pub kernel_width: u32,
    /// Stride along the height (`subsampling_height`).
    pub stride_height: u32,
    /// Stride along the width (`subsampling_width`).
    pub stride_width: u32,
    /// Distance in input rows between filter taps; 1 is no dilation (`dilation_height`).
    pub dilation_height: u32,
    /// Distance in input columns between filter taps; 1 is no dilation (`dilation_width`).
    pub dilation_width: u32,
    /// Output channels per input channel (`depth_multiplier`).
    pub depth_multiplier: u32,
    /// Channels of the input (`input_channels`).
    pub input_channels: usize,
    /// Lower bound the output is clamped to.
    pub output_min: f32,
    /// Upper bound the output is clamped to.
    pub output_max: f32,
    /// Pad like TensorFlow's "SAME" (`XNN_FLAG_TENSORFLOW_SAME_PADDING`).
    pub tensorflow_same_padding: bool,
}

impl DepthwiseConvolution2dParams {
    /// Stride 1, no dilation, no padding, no clamping.
    pub fn new(
        kernel_height: u32,
        kernel_width: u32,
        input_channels: usize,
        depth_multiplier: u32,
    ) -> DepthwiseConvolution2dParams {
        DepthwiseConvolution2dParams {
            padding: Padding2d::default(),
            kernel_height,
            kernel_width,
            stride_height: 1,
            stride_width: 1,
            dilation_height: 1,
            dilation_width: 1,
            depth_multiplier,
            input_channels,
            output_min: f32::NEG_INFINITY,
            output_max: f32::INFINITY,
            tensorflow_same_padding: false,
        }
    }
}

fn same_padding_flag(tensorflow_same_padding: bool) -> u32 {
    if tensorflow_same_padding {
        sys::XNN_FLAG_TENSORFLOW_SAME_PADDING
    } else {
        0
    }
}

impl Subgraph<'_> {
    /// Defines `output = clamp(input · filterᵀ + bias, output_min, output_max)` with a filter of
    /// shape [output_channels, input_channels].
    pub fn define_fully_connected(
        &mut self,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
        output_min: f32,
        output_max: f32,
    ) -> Result<(), XnnError> {
        self.define_fully_connected_with_flags(
            input,
            filter,
            bias,
            output,
            output_min,
            output_max,
            FullyConnectedFlags::default(),
        )
    }

    /// [`define_fully_connected`](Self::define_fully_connected) with features: with
    /// `transpose_weights` the filter is [input_channels, output_channels]. The input may be
    /// fp32 or (with qcint8, qcint4 or qbint4 filters) a qdint8 tensor.
    ///
    /// The wrapper refuses transposed qbint4 filters, which this XNNPACK has no packing for,
    /// and transposed qcint4 filters with an odd dimension: XNNPACK reads those as nibbles
    /// running on across rows and, on some CPUs, a whole row past the last one, which is not
    /// the byte-per-row layout [`Datatype::tensor_bytes`] sized the data for. It refuses a bias
    /// of another element count than the filter has output channels (XNNPACK reads that many).
    // Mirrors xnn_define_fully_connected's own parameter list.
    #[allow(clippy::too_many_arguments)]
    pub fn define_fully_connected_with_flags(
        &mut self,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
        output_min: f32,
        output_max: f32,
        flags: FullyConnectedFlags,
    ) -> Result<(), XnnError> {
        const CALL: &str = "xnn_define_fully_connected";
        if flags.transpose_weights {
            match (self.datatype(filter), self.dims(filter)) {
                // XNNPACK only asserts this in debug builds, then calls a null packing function.
                (Some(Datatype::Qbint4), _) => return Err(refuse(CALL)),
                (Some(datatype), Some(dims))
                    if datatype.bits() == 4 && dims.iter().any(|d| !d.is_multiple_of(2)) =>
                {
                    return Err(refuse(CALL));
                }
                _ => {}
            }
        }
        // XNNPACK reads as many biases as the filter has output channels, whatever the bias
        // holds.
        if let Some(bias) = bias {
            let dim = usize::from(flags.transpose_weights);
            let outputs = self.dims(filter).and_then(|dims| dims.get(dim).copied());
            if !self.holds(bias, outputs) {
                return Err(refuse(CALL));
            }
        }
        self.writable(output, CALL)?;
        // SAFETY: plain values; XNNPACK validates the ids against this subgraph, and the bias
        // holds what it reads (checked above).
        check(CALL, unsafe {
            sys::xnn_define_fully_connected(
                self.as_raw(),
                output_min,
                output_max,
                input,
                filter,
                bias.unwrap_or(sys::XNN_INVALID_VALUE_ID),
                output,
                flags.to_raw(),
            )
        })
    }

    /// Defines a 2-D convolution over NHWC tensors; see [`Convolution2dParams`] for the shapes.
    /// The wrapper refuses a filter or bias of another element count than the parameters give
    /// it (XNNPACK reads that many).
    pub fn define_convolution_2d(
        &mut self,
        params: &Convolution2dParams,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
    ) -> Result<(), XnnError> {
        const CALL: &str = "xnn_define_convolution_2d";
        let p = params;
        // XNNPACK checks only the filter's output channels, then packs kernel_height *
        // kernel_width * group_input_channels weights for each, and as many biases, from
        // whatever the operands hold: a filter smaller than its kernel was read past its end
        // (found by fuzzing the delegate).
        let outputs = elements(&[p.groups as usize, p.group_output_channels]);
        let weights = outputs.and_then(|o| {
            elements(&[
                o,
                p.kernel_height as usize,
                p.kernel_width as usize,
                p.group_input_channels,
            ])
        });
        if !self.holds(filter, weights) || bias.is_some_and(|b| !self.holds(b, outputs)) {
            return Err(refuse(CALL));
        }
        self.writable(output, CALL)?;
        // SAFETY: plain values; XNNPACK validates the ids and the other parameters, and the
        // filter and bias hold what it reads (checked above).
        check(CALL, unsafe {
            sys::xnn_define_convolution_2d(
                self.as_raw(),
                p.padding.top,
                p.padding.right,
                p.padding.bottom,
                p.padding.left,
                p.kernel_height,
                p.kernel_width,
                p.stride_height,
                p.stride_width,
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
                same_padding_flag(p.tensorflow_same_padding),
            )
        })
    }

    /// Defines a 2-D depthwise convolution over NHWC tensors; see
    /// [`DepthwiseConvolution2dParams`] for the shapes. The wrapper refuses a filter or bias of
    /// another element count than the parameters give it (XNNPACK reads that many).
    pub fn define_depthwise_convolution_2d(
        &mut self,
        params: &DepthwiseConvolution2dParams,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
    ) -> Result<(), XnnError> {
        const CALL: &str = "xnn_define_depthwise_convolution_2d";
        let p = params;
        // As for the convolution: XNNPACK reads kernel_height * kernel_width weights and one
        // bias per output channel, unchecked.
        let outputs = elements(&[p.input_channels, p.depth_multiplier as usize]);
        let weights =
            outputs.and_then(|o| elements(&[o, p.kernel_height as usize, p.kernel_width as usize]));
        if !self.holds(filter, weights) || bias.is_some_and(|b| !self.holds(b, outputs)) {
            return Err(refuse(CALL));
        }
        self.writable(output, CALL)?;
        // SAFETY: plain values; XNNPACK validates the ids and the other parameters, and the
        // filter and bias hold what it reads (checked above).
        check(CALL, unsafe {
            sys::xnn_define_depthwise_convolution_2d(
                self.as_raw(),
                p.padding.top,
                p.padding.right,
                p.padding.bottom,
                p.padding.left,
                p.kernel_height,
                p.kernel_width,
                p.stride_height,
                p.stride_width,
                p.dilation_height,
                p.dilation_width,
                p.depth_multiplier,
                p.input_channels,
                p.output_min,
                p.output_max,
                input,
                filter,
                bias.unwrap_or(sys::XNN_INVALID_VALUE_ID),
                output,
                same_padding_flag(p.tensorflow_same_padding),
            )
        })
    }
}
