//! Defining a payload's values in an XNNPACK subgraph.

use super::constants::{Constant, Loaded, Private};
use super::error::{DelegateError, at};
use super::fallback::{Twins, internal_datatype};
use super::fold::Folds;
use super::graph::{
    ById, Tensor, TensorView, Values, XNN_FLAG_EXTERNAL_INPUT, XNN_FLAG_EXTERNAL_OUTPUT,
    constant_index, datatype, dims_of,
};
use crate::xnn::{
    BlockwiseQuantization, BlockwiseScales, ChannelwiseQuantization, Datatype, Subgraph, ValueRole,
};

/// Defines every value of the graph; returns the payload id -> subgraph id map (the nodes'
/// view), and the conversions to define around the nodes when fp16 is computed as fp32: there an
/// fp16 external keeps its fp16 value, and the nodes get an fp32 twin of it instead.
///
/// The reshapes in `folds` are done by binding: their inputs are not defined, and their outputs
/// are defined as those inputs, under the reshapes' shapes.
pub(super) fn define_values<'k>(
    g: &mut Subgraph<'k>,
    values: &Values<'_>,
    keep: &'k Loaded,
    folds: &Folds,
) -> Result<(ById<u32>, Twins), DelegateError> {
    // By payload id, densely where the ids are: every node's operands are found here.
    let mut ids = ById::new(values.largest(), values.len());
    let mut twins = Twins::default();
    // Most graphs fold nothing: their values are not looked up in the folds.
    let folding = !folds.is_empty();
    for each in values.each() {
        let (i, (t, q)) = each?;
        if folding && folds.folds_input(t.id_out()) {
            continue;
        }
        if let Some(input) = folding.then(|| folds.folded_output(t.id_out())).flatten() {
            let dims = dims_of(&t);
            let dt = datatype(t.datatype(), i)?;
            let id = g
                .define_reshaped_input(dt, &dims, &input.dims, input.external_id)
                .map_err(at(|| {
                    format!("value {i} ({dt:?} {dims:?}, input {:?})", input.dims)
                }))?;
            ids.insert(t.id_out(), id);
            continue;
        }
        let role = role_of(&t, i, keep)?;
        let external = matches!(role, ValueRole::Input(_) | ValueRole::Output(_));
        let fp16 = datatype(t.datatype(), i)? == Datatype::Fp16;
        if keep.fp16_as_fp32 && external && fp16 && q.is_none() {
            let dims = dims_of(&t);
            let id = g
                .define_tensor(Datatype::Fp16, &dims, role)
                .map_err(at(|| format!("value {i} (fp16 external {dims:?})")))?;
            let twin = define_value(g, (t, q), i, keep, ValueRole::Internal)?;
            match role {
                ValueRole::Input(_) => twins.inputs.push((id, twin)),
                _ => twins.outputs.push((twin, id)),
            }
            ids.insert(t.id_out(), twin);
            continue;
        }
        ids.insert(t.id_out(), define_value(g, (t, q), i, keep, role)?);
    }
    Ok((ids, twins))
}

/// What value `i` is in the subgraph: constant data (or its placeholder), an external input or
/// output, or internal.
pub(super) fn role_of<'k>(
    t: &TensorView<'_>,
    i: usize,
    keep: &'k Loaded,
) -> Result<ValueRole<'k>, DelegateError> {
    let index = constant_index(t);
    match keep.private(i) {
        Some(Private::Placeholder { data, .. }) => return Ok(ValueRole::Deferred(data)),
        Some(Private::Copy(copy)) => return Ok(ValueRole::Static(copy.data())),
        None => {}
    }
    Ok(if index != 0 {
        let c = keep.constants.get(index).ok_or_else(|| {
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
    tensor: Tensor<'_>,
    i: usize,
    keep: &'k Loaded,
    role: ValueRole<'k>,
) -> Result<u32, DelegateError> {
    define_value_scaled(g, tensor, i, keep, role, None)
}

/// As [`define_value`], with a blockwise value's scales read from `scales` where given rather
/// than as `keep` holds them (packing ahead, from the source's own bytes, see
/// [`super::prepack`]).
pub(super) fn define_value_scaled<'k>(
    g: &mut Subgraph<'k>,
    (t, q): Tensor<'_>,
    i: usize,
    keep: &'k Loaded,
    role: ValueRole<'k>,
    scales: Option<BlockwiseScales<'k>>,
) -> Result<u32, DelegateError> {
    let dims = dims_of(&t);
    let dt = internal_datatype(datatype(t.datatype(), i)?, keep.fp16_as_fp32);
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
        let Some(scales) = scales.or_else(|| keep.bf16_scales(i)) else {
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
