//! A built graph as XNNPACK's delegate payload: the flatbuffer of its values and nodes.

use super::*;

impl GraphBuilder {
    /// Serialises the graph: `XH00` header, `XN01` flatbuffer, no inline constants.
    pub fn finish(self) -> BuiltGraph {
        let mut b = FlatBufferBuilder::new();
        let values: Vec<_> = self
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let dims = b.create_vector(&v.dims);
                let tensor = fb::XNNTensorValue::create(
                    &mut b,
                    &fb::XNNTensorValueArgs {
                        datatype: v.datatype,
                        num_dims: v.dims.len() as u32,
                        dims: Some(dims),
                        constant_buffer_idx: v.constant,
                        external_id: v.external_id,
                        flags: v.flags,
                        id_out: i as u32,
                    },
                );
                let (kind, union): (fb::XValueUnion, WIPOffset<UnionWIPOffset>) = match &v.quant {
                    None => (fb::XValueUnion::XNNTensorValue, tensor.as_union_value()),
                    Some(q) => {
                        let (qt, qp) = match *q {
                            Quant::Channel {
                                scale_idx,
                                channel_dim,
                            } => (
                                fb::XNNQuantParams::PerChannelQuant,
                                fb::PerChannelQuant::create(
                                    &mut b,
                                    &fb::PerChannelQuantArgs {
                                        scale: None,
                                        channel_dim,
                                        scale_buffer_idx: scale_idx,
                                        num_scales: v.dims[channel_dim as usize],
                                    },
                                )
                                .as_union_value(),
                            ),
                            Quant::ChannelGroup {
                                scale_idx,
                                channel_dim,
                                group_size,
                            } => {
                                let scale = v.inline_scales.as_ref().map(|s| b.create_vector(s));
                                let num_scales = if scale.is_some() {
                                    0
                                } else {
                                    v.dims[0] * v.dims[1] / group_size as u32
                                };
                                (
                                    fb::XNNQuantParams::PerChannelGroupQuant,
                                    fb::PerChannelGroupQuant::create(
                                        &mut b,
                                        &fb::PerChannelGroupQuantArgs {
                                            scale,
                                            channel_dim,
                                            group_size,
                                            scale_bf16: None,
                                            scale_buffer_idx: scale_idx,
                                            num_scales,
                                        },
                                    )
                                    .as_union_value(),
                                )
                            }
                            Quant::TokenDynamic { num_nonbatch_dims } => (
                                fb::XNNQuantParams::PerTokenDynamicQuant,
                                fb::PerTokenDynamicQuant::create(
                                    &mut b,
                                    &fb::PerTokenDynamicQuantArgs { num_nonbatch_dims },
                                )
                                .as_union_value(),
                            ),
                        };
                        let q = fb::XNNQuantizedTensorValue::create(
                            &mut b,
                            &fb::XNNQuantizedTensorValueArgs {
                                tensor_value: Some(tensor),
                                quant_params_type: qt,
                                quant_params: Some(qp),
                            },
                        );
                        (fb::XValueUnion::XNNQuantizedTensorValue, q.as_union_value())
                    }
                };
                fb::XValue::create(
                    &mut b,
                    &fb::XValueArgs {
                        xvalue_union_type: kind,
                        xvalue_union: Some(union),
                    },
                )
            })
            .collect();
        let nodes: Vec<_> = self
            .nodes
            .iter()
            .map(|(node, clamp)| {
                let (kind, union) = encode_node(&mut b, node);
                // The builder writes only what the operator table defines.
                debug_assert!(
                    xnnblob::delegate::operators::find(kind).is_some(),
                    "the builder wrote {kind:?}, which src/delegate/operators/ lacks"
                );
                let output_min_max = clamp.map(|(output_min, output_max)| {
                    fb::OutputMinMax::create(
                        &mut b,
                        &fb::OutputMinMaxArgs {
                            output_min,
                            output_max,
                        },
                    )
                });
                fb::XNode::create(
                    &mut b,
                    &fb::XNodeArgs {
                        xnode_union_type: kind,
                        xnode_union: Some(union),
                        debug_handle: 0,
                        output_min_max,
                    },
                )
            })
            .collect();
        let mut constants = vec![fb::ConstantDataOffset::create(
            &mut b,
            &fb::ConstantDataOffsetArgs::default(),
        )];
        for key in &self.constants {
            let k = b.create_string(key);
            constants.push(fb::ConstantDataOffset::create(
                &mut b,
                &fb::ConstantDataOffsetArgs {
                    offset: u64::MAX,
                    size: 0,
                    named_key: Some(k),
                },
            ));
        }
        let version = b.create_string("0");
        let values = b.create_vector(&values);
        let nodes = b.create_vector(&nodes);
        let inputs = b.create_vector(&self.inputs);
        let outputs = b.create_vector(&self.outputs);
        let constants = b.create_vector(&constants);
        let graph = fb::XNNGraph::create(
            &mut b,
            &fb::XNNGraphArgs {
                version: Some(version),
                xnodes: Some(nodes),
                xvalues: Some(values),
                num_externs: self.externs,
                input_ids: Some(inputs),
                output_ids: Some(outputs),
                constant_data: Some(constants),
            },
        );
        fb::finish_xnngraph_buffer(&mut b, graph);
        let flatbuffer = b.finished_data();

        let fb_offset = HEADER_LENGTH.next_multiple_of(FLATBUFFER_ALIGNMENT);
        let const_offset = (fb_offset + flatbuffer.len()).next_multiple_of(FLATBUFFER_ALIGNMENT);
        let header = PayloadHeader {
            length: HEADER_LENGTH as u16,
            flatbuffer_offset: fb_offset as u32,
            flatbuffer_size: flatbuffer.len() as u32,
            constant_data_offset: const_offset as u32,
            constant_data_size: 0,
        };
        let mut payload = header.encode().to_vec();
        payload.resize(fb_offset, 0);
        payload.extend_from_slice(flatbuffer);
        payload.resize(const_offset, 0);
        let mut externals: Vec<(u32, crate::program_writer::External)> = self
            .inputs
            .iter()
            .map(|&v| (v, false))
            .chain(self.outputs.iter().map(|&v| (v, true)))
            .map(|(v, output)| {
                let spec = &self.values[v as usize];
                let dims = spec.dims.iter().map(|&d| d as usize).collect();
                let external = if spec.datatype == fb::XNNDatatype::xnn_datatype_fp16 {
                    crate::program_writer::External::f16(dims, output)
                } else {
                    crate::program_writer::External::f32(dims, output)
                };
                (spec.external_id, external)
            })
            .collect();
        externals.sort_by_key(|(id, _)| *id);
        BuiltGraph {
            payload,
            blobs: self.blobs,
            externals: externals.into_iter().map(|(_, e)| e).collect(),
        }
    }
}

fn encode_node(
    b: &mut FlatBufferBuilder<'_>,
    node: &Node,
) -> (fb::XNodeUnion, WIPOffset<UnionWIPOffset>) {
    const NONE: u32 = u32::MAX;
    match node {
        Node::FullyConnected {
            input,
            filter,
            bias,
            output,
        } => (
            fb::XNodeUnion::XNNFullyConnected,
            fb::XNNFullyConnected::create(
                b,
                &fb::XNNFullyConnectedArgs {
                    input1_id: *input,
                    filter_id: *filter,
                    bias_id: bias.unwrap_or(NONE),
                    output_id: *output,
                    flags: 0,
                },
            )
            .as_union_value(),
        ),
        Node::Conv {
            depthwise,
            geometry: g,
            groups,
            group_in,
            group_out,
            input,
            filter,
            bias,
            output,
        } => (
            if *depthwise {
                fb::XNodeUnion::XNNDepthwiseConv2d
            } else {
                fb::XNodeUnion::XNNConv2d
            },
            fb::_XNNNodeConv::create(
                b,
                &fb::_XNNNodeConvArgs {
                    padding_top: g.padding[0],
                    padding_right: g.padding[1],
                    padding_bottom: g.padding[2],
                    padding_left: g.padding[3],
                    kernel_height: g.kernel.0,
                    kernel_width: g.kernel.1,
                    subsampling_height: g.stride.0,
                    subsampling_width: g.stride.1,
                    dilation_height: g.dilation.0,
                    dilation_width: g.dilation.1,
                    group_input_channels: *group_in,
                    group_output_channels: *group_out,
                    groups: *groups,
                    adjustment_height: 0,
                    adjustment_width: 0,
                    input1_id: *input,
                    filter_id: *filter,
                    bias_id: bias.unwrap_or(NONE),
                    output_id: *output,
                    flags: 0,
                },
            )
            .as_union_value(),
        ),
        Node::Binary {
            kind,
            a,
            b: bb,
            output,
        } => (
            *kind,
            fb::_XNNNode2x1::create(
                b,
                &fb::_XNNNode2x1Args {
                    input1_id: *a,
                    input2_id: *bb,
                    output_id: *output,
                    flags: 0,
                },
            )
            .as_union_value(),
        ),
        Node::Unary {
            kind,
            input,
            output,
            flags,
        } => (
            *kind,
            fb::_XNNNode1x1::create(
                b,
                &fb::_XNNNode1x1Args {
                    input_id: *input,
                    output_id: *output,
                    flags: *flags,
                },
            )
            .as_union_value(),
        ),
        Node::Reshape {
            shape,
            input,
            output,
        } => {
            let s = b.create_vector(shape);
            (
                fb::XNodeUnion::XNNStaticReshape,
                fb::XNNStaticReshape::create(
                    b,
                    &fb::XNNStaticReshapeArgs {
                        num_dims: shape.len() as u32,
                        new_shape: Some(s),
                        input_id: *input,
                        output_id: *output,
                        flags: 0,
                    },
                )
                .as_union_value(),
            )
        }
        Node::Pad {
            pre,
            post,
            value,
            input,
            output,
        } => {
            let pre = b.create_vector(pre);
            let post = b.create_vector(post);
            (
                fb::XNodeUnion::XNNStaticConstantPad,
                fb::XNNStaticConstantPad::create(
                    b,
                    &fb::XNNStaticConstantPadArgs {
                        pre_paddings: Some(pre),
                        post_paddings: Some(post),
                        padding_value: *value,
                        input_id: *input,
                        output_id: *output,
                        flags: 0,
                    },
                )
                .as_union_value(),
            )
        }
        Node::Slice {
            offsets,
            sizes,
            input,
            output,
        } => {
            let o = b.create_vector(offsets);
            let sz = b.create_vector(sizes);
            (
                fb::XNodeUnion::XNNStaticSlice,
                fb::XNNStaticSlice::create(
                    b,
                    &fb::XNNStaticSliceArgs {
                        num_dims: offsets.len() as u32,
                        offsets: Some(o),
                        sizes: Some(sz),
                        input_id: *input,
                        output_id: *output,
                        flags: 0,
                    },
                )
                .as_union_value(),
            )
        }
        Node::Elu {
            alpha,
            input,
            output,
        } => (
            fb::XNodeUnion::XNNELU,
            fb::XNNELU::create(
                b,
                &fb::XNNELUArgs {
                    alpha: *alpha,
                    input_id: *input,
                    output_id: *output,
                    flags: 0,
                },
            )
            .as_union_value(),
        ),
        Node::Attention {
            query,
            key,
            value,
            scale,
            mask,
            output,
        } => (
            fb::XNodeUnion::XNNScaledDotProductAttention,
            fb::XNNScaledDotProductAttention::create(
                b,
                &fb::XNNScaledDotProductAttentionArgs {
                    query_id: *query,
                    key_id: *key,
                    value_id: *value,
                    scale_id: *scale,
                    mask_id: *mask,
                    output_id: *output,
                    flags: 0,
                },
            )
            .as_union_value(),
        ),
        Node::Concat2 {
            axis,
            a,
            b: bb,
            output,
        } => (
            fb::XNodeUnion::XNNConcatenate2,
            fb::_XNNCat::create(
                b,
                &fb::_XNNCatArgs {
                    axis: *axis,
                    input1_id: *a,
                    input2_id: *bb,
                    output_id: *output,
                    ..Default::default()
                },
            )
            .as_union_value(),
        ),
        Node::Transpose {
            perm,
            input,
            output,
        } => {
            let p = b.create_vector(perm);
            (
                fb::XNodeUnion::XNNStaticTranspose,
                fb::XNNStaticTranspose::create(
                    b,
                    &fb::XNNStaticTransposeArgs {
                        num_dims: perm.len() as u32,
                        perm: Some(p),
                        input_id: *input,
                        output_id: *output,
                        flags: 0,
                    },
                )
                .as_union_value(),
            )
        }
    }
}
