//! Reading a payload's graph: datatypes, tensor values, their constants and external flags.

use super::error::DelegateError;
use crate::schema::xnn as fb;
use crate::xnn::Datatype;

pub(super) const XNN_FLAG_EXTERNAL_INPUT: u32 = 1;

pub(super) const XNN_FLAG_EXTERNAL_OUTPUT: u32 = 2;

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

pub(super) fn constant_index(t: &fb::XNNTensorValue<'_>) -> usize {
    t.constant_buffer_idx() as usize
}

/// The named key of constant `index`, if it has one.
pub(super) fn named_key<'g>(graph: &fb::XNNGraph<'g>, index: usize) -> Option<&'g str> {
    let all = graph.constant_data()?;
    (index < all.len()).then(|| all.get(index).named_key())?
}

pub(super) fn dims_of(t: &fb::XNNTensorValue<'_>) -> Vec<usize> {
    t.dims()
        .map(|d| d.iter().map(|x| x as usize).collect())
        .unwrap_or_default()
}
