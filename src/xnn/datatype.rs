//! The element types of XNNPACK's tensor values.

use xnnpack_sys as sys;

/// The element type of a tensor value (`xnn_datatype_*`).
///
/// The quantized types need the matching `define_*quantized_tensor` method; `define_tensor`
/// takes the plain ones (fp32, fp16, bf16, int32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Datatype {
    /// IEEE 754 single precision.
    Fp32,
    /// IEEE 754 half precision.
    Fp16,
    /// bfloat16: the upper 16 bits of an fp32.
    Bf16,
    /// Plain 32-bit signed integers.
    Int32,
    /// 8-bit signed integers with one zero point and scale for the whole tensor.
    Qint8,
    /// 8-bit unsigned integers with one zero point and scale for the whole tensor.
    Quint8,
    /// 32-bit signed integers with one scale for the whole tensor (zero point 0).
    Qint32,
    /// 8-bit signed integers with a scale per channel.
    Qcint8,
    /// 32-bit signed integers with a scale per channel (zero point 0).
    Qcint32,
    /// 4-bit integers with a scale per channel, two per byte.
    Qcint4,
    /// 8-bit signed integers quantized at run time, with parameters per batch row.
    Qdint8,
    /// 4-bit integers with a bf16 scale per block of input channels, two per byte.
    Qbint4,
}

impl Datatype {
    /// The `xnn_datatype` this stands for.
    pub fn to_raw(self) -> sys::xnn_datatype {
        match self {
            Datatype::Fp32 => sys::xnn_datatype_fp32,
            Datatype::Fp16 => sys::xnn_datatype_fp16,
            Datatype::Bf16 => sys::xnn_datatype_bf16,
            Datatype::Int32 => sys::xnn_datatype_int32,
            Datatype::Qint8 => sys::xnn_datatype_qint8,
            Datatype::Quint8 => sys::xnn_datatype_quint8,
            Datatype::Qint32 => sys::xnn_datatype_qint32,
            Datatype::Qcint8 => sys::xnn_datatype_qcint8,
            Datatype::Qcint32 => sys::xnn_datatype_qcint32,
            Datatype::Qcint4 => sys::xnn_datatype_qcint4,
            Datatype::Qdint8 => sys::xnn_datatype_qdint8,
            Datatype::Qbint4 => sys::xnn_datatype_qbint4,
        }
    }

    /// Bits per element.
    pub fn bits(self) -> usize {
        match self {
            Datatype::Qcint4 | Datatype::Qbint4 => 4,
            Datatype::Qint8 | Datatype::Quint8 | Datatype::Qcint8 | Datatype::Qdint8 => 8,
            Datatype::Fp16 | Datatype::Bf16 => 16,
            Datatype::Fp32 | Datatype::Int32 | Datatype::Qint32 | Datatype::Qcint32 => 32,
        }
    }

    /// The bytes static data of shape `dims` takes, as XNNPACK's weight packing reads it:
    /// elements × bits / 8. 4-bit elements are packed two per byte, the even-indexed one in
    /// the low nibble, and each row (the innermost dimension) starts on a byte: a row of an odd
    /// length ends with a spare high nibble, which must hold the tensor's zero point. That is
    /// the layout XNNPACK's fully connected packing reads for `[output_channels,
    /// input_channels]` 4-bit filters: it rounds the input channels up to even, and its qd8
    /// kernels then use the spare nibble as the weight of one more input channel, which the
    /// zero point makes 0. It is more than `xnn_tensor_get_size`'s rounding of the whole
    /// tensor when rows are odd. None if the size does not fit in a `usize`.
    pub fn tensor_bytes(self, dims: &[usize]) -> Option<usize> {
        if self.bits() == 4 {
            let Some((&row, outer)) = dims.split_last() else {
                return Some(1); // a scalar: one nibble in one byte
            };
            let rows = outer.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
            return rows.checked_mul(row.div_ceil(2));
        }
        let elements = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        elements.checked_mul(self.bits() / 8)
    }

    /// The element type a buffer bound to an external value of this type holds; None for the
    /// types XNNPACK keeps internal or constant (per-channel, blockwise, dynamic quantization).
    pub fn boundary_dtype(self) -> Option<crate::tensor::DType> {
        use crate::tensor::DType;
        Some(match self {
            Datatype::Fp32 => DType::F32,
            Datatype::Fp16 => DType::F16,
            Datatype::Bf16 => DType::BF16,
            Datatype::Int32 | Datatype::Qint32 => DType::I32,
            Datatype::Qint8 => DType::I8,
            Datatype::Quint8 => DType::U8,
            _ => return None,
        })
    }

    /// The alignment static data of this type needs: its element size, at least 1.
    pub(super) fn alignment(self) -> usize {
        (self.bits() / 8).max(1)
    }
}
