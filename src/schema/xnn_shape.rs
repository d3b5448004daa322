//! The XNNPACK payload's graph (`schema/xnnpack.fbs`, root `XNNGraph`) as [`super::verify`]
//! checks it: every table's fields in slot order. A test reads the schema and holds these to
//! it, name for name and slot for slot.

use super::verify::Field::{
    Deprecated, Scalar, Scalars, String, Table, Tables, Union, UnionType, Unread,
};
use super::verify::{Check, Checked, Shape, TableShape, Verifier};

/// Defines each shape as a static [`Shape`] (its fields as data, which the test below holds
/// to the schema) and as a [`TableShape`] whose checks are the same fields written out.
macro_rules! table_shapes {
    ($($shape:ident = $name:literal [$(($field:literal, $kind:expr $(,)?)),* $(,)?])*) => {$(
        pub(crate) static $shape: Shape = Shape {
            name: $name,
            fields: &[$(($field, $kind)),*],
            check: Check::of::<$shape>(),
        };

        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub(crate) struct $shape {}

        impl TableShape for $shape {
            fn check(v: &mut Verifier<'_, '_>, pos: usize) -> Checked {
                v.checked_table(pos, &$shape, |v, table, slot| {
                    $(v.next_field(table, slot, const { $kind })?;)*
                    Ok(())
                })
            }
        }
    )*};
}

table_shapes! {
    PER_CHANNEL_GROUP_QUANT = "PerChannelGroupQuant" [
        ("scale", Scalars(4)),
        ("channel_dim", Scalar(4)),
        ("group_size", Scalar(4)),
        ("scale_bf16", Scalars(2)),
        ("scale_buffer_idx", Scalar(4)),
        ("num_scales", Scalar(4)),

    ]
    PER_CHANNEL_QUANT = "PerChannelQuant" [
        ("scale", Scalars(4)),
        ("channel_dim", Scalar(4)),
        ("scale_buffer_idx", Scalar(4)),
        ("num_scales", Scalar(4)),

    ]
    PER_TOKEN_DYNAMIC_QUANT = "PerTokenDynamicQuant" [
        ("num_nonbatch_dims", Scalar(4)),
    ]
    PER_TENSOR_QUANT = "PerTensorQuant" [
        ("scale", Scalar(4)), ("zero_point", Scalar(4)),
    ]
    TENSOR_VALUE = "XNNTensorValue" [
        ("datatype", Scalar(2)),
        ("num_dims", Scalar(4)),
        ("dims", Scalars(4)),
        ("constant_buffer_idx", Scalar(4)),
        ("external_id", Scalar(4)),
        ("flags", Scalar(4)),
        ("id_out", Scalar(4)),

    ]
    QUANTIZED_TENSOR_VALUE = "XNNQuantizedTensorValue" [
        ("tensor_value", Table(&TENSOR_VALUE)),
        ("quant_params_type", UnionType),
        (
            "quant_params",
            Union(&[
                &PER_CHANNEL_QUANT,
                &PER_TENSOR_QUANT,
                &PER_TOKEN_DYNAMIC_QUANT,
                &PER_CHANNEL_GROUP_QUANT,
            ]),
        ),

    ]
    OUTPUT_MIN_MAX = "OutputMinMax" [
        ("output_min", Scalar(4)), ("output_max", Scalar(4)),
    ]
    NODE = "XNode" [
        ("xnode_union_type", UnionType),
        (
            "xnode_union",
            Union(&[
                &NODE_2X1,
                &FULLY_CONNECTED,
                &NODE_1X1,
                &NODE_1X1,
                &STATIC_TRANSPOSE,
                &NODE_1X1,
                &NODE_CONV,
                &NODE_2X1,
                &STATIC_RESIZE_BILINEAR_2D,
                &STATIC_CONSTANT_PAD,
                &POOLING_2D,
                &NODE_2X1,
                &NODE_CONV,
                &POOLING_2D,
                &NODE_2X1,
                &NODE_2X1,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &STATIC_RESHAPE,
                &ARG_MAX_POOLING_2D,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &LEAKY_RELU,
                &NODE_2X1,
                &NODE_1X1,
                &NODE_1X1,
                &ELU,
                &NODE_1X1,
                &NODE_2X1,
                &CAT,
                &CAT,
                &CAT,
                &STATIC_SLICE,
                &SCALED_DOT_PRODUCT_ATTENTION,
                &NODE_2X1,
                &CAT,
                &NODE_CONV,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
                &NODE_1X1,
            ]),
        ),
        ("debug_handle", Scalar(4)),
        ("output_min_max", Table(&OUTPUT_MIN_MAX)),

    ]
    VALUE = "XValue" [
        ("xvalue_union_type", UnionType),
        (
            "xvalue_union",
            Union(&[&TENSOR_VALUE, &QUANTIZED_TENSOR_VALUE]),
        ),

    ]
    STATIC_TRANSPOSE = "XNNStaticTranspose" [
        ("num_dims", Scalar(4)),
        ("perm", Scalars(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    STATIC_RESIZE_BILINEAR_2D = "XNNStaticResizeBilinear2D" [
        ("new_height", Scalar(4)),
        ("new_width", Scalar(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    STATIC_CONSTANT_PAD = "XNNStaticConstantPad" [
        ("pre_paddings", Scalars(4)),
        ("post_paddings", Scalars(4)),
        ("padding_value", Scalar(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    NODE_2X1 = "_XNNNode2x1" [
        ("input1_id", Scalar(4)),
        ("input2_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    NODE_1X1 = "_XNNNode1x1" [
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    ELU = "XNNELU" [
        ("alpha", Scalar(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    FULLY_CONNECTED = "XNNFullyConnected" [
        ("input1_id", Scalar(4)),
        ("filter_id", Scalar(4)),
        ("bias_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    NODE_CONV = "_XNNNodeConv" [
        ("padding_top", Scalar(4)),
        ("padding_right", Scalar(4)),
        ("padding_bottom", Scalar(4)),
        ("padding_left", Scalar(4)),
        ("kernel_height", Scalar(4)),
        ("kernel_width", Scalar(4)),
        ("subsampling_height", Scalar(4)),
        ("subsampling_width", Scalar(4)),
        ("dilation_height", Scalar(4)),
        ("dilation_width", Scalar(4)),
        ("group_input_channels", Scalar(4)),
        ("group_output_channels", Scalar(4)),
        ("groups", Scalar(4)),
        ("adjustment_height", Scalar(4)),
        ("adjustment_width", Scalar(4)),
        ("input1_id", Scalar(4)),
        ("filter_id", Scalar(4)),
        ("bias_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    POOLING_2D = "_XNNPooling2D" [
        ("padding_top", Scalar(4)),
        ("padding_right", Scalar(4)),
        ("padding_bottom", Scalar(4)),
        ("padding_left", Scalar(4)),
        ("pooling_height", Scalar(4)),
        ("pooling_width", Scalar(4)),
        ("stride_height", Scalar(4)),
        ("stride_width", Scalar(4)),
        ("dilation_height", Scalar(4)),
        ("dilation_width", Scalar(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    CAT = "_XNNCat" [
        ("axis", Scalar(4)),
        ("input1_id", Scalar(4)),
        ("input2_id", Scalar(4)),
        ("input3_id", Scalar(4)),
        ("input4_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),
        ("input5_id", Scalar(4)),

    ]
    STATIC_SLICE = "XNNStaticSlice" [
        ("num_dims", Scalar(4)),
        ("offsets", Scalars(4)),
        ("sizes", Scalars(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    SCALED_DOT_PRODUCT_ATTENTION = "XNNScaledDotProductAttention" [
        ("query_id", Scalar(4)),
        ("key_id", Scalar(4)),
        ("value_id", Scalar(4)),
        ("scale_id", Scalar(4)),
        ("mask_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    ARG_MAX_POOLING_2D = "XNNArgMaxPooling2d" [
        ("padding_top", Scalar(4)),
        ("padding_right", Scalar(4)),
        ("padding_bottom", Scalar(4)),
        ("padding_left", Scalar(4)),
        ("pooling_height", Scalar(4)),
        ("pooling_width", Scalar(4)),
        ("input_id", Scalar(4)),
        ("output_value_id", Scalar(4)),
        ("output_index_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    LEAKY_RELU = "XNNLeakyReLU" [
        ("negative_slope", Scalar(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    STATIC_RESHAPE = "XNNStaticReshape" [
        ("num_dims", Scalar(4)),
        ("new_shape", Scalars(4)),
        ("input_id", Scalar(4)),
        ("output_id", Scalar(4)),
        ("flags", Scalar(4)),

    ]
    CONSTANT_DATA_OFFSET = "ConstantDataOffset" [
        ("offset", Scalar(8)),
        ("size", Scalar(8)),
        ("named_key", String),

    ]
    GRAPH = "XNNGraph" [
        ("version", String),
        ("xnodes", Tables(&NODE)),
        ("xvalues", Tables(&VALUE)),
        ("num_externs", Scalar(4)),
        ("input_ids", Scalars(4)),
        ("output_ids", Scalars(4)),
        ("constant_buffer", Deprecated),
        ("mem_buffer_sizes", Deprecated),
        ("constant_data", Tables(&CONSTANT_DATA_OFFSET)),

    ]
}

// A view of the graph: what `schema::xnn_node_types` reads (each node's type, before a face
// decides whether a delegate needs a weights cache at all), and nothing more. Its type byte is
// read alone, as a scalar, so the union's value is left unread. A test holds each of its fields
// to the full shape's slot.
table_shapes! {
    NODE_TYPE = "XNode" [
        ("xnode_union_type", Scalar(1)),
    ]
    GRAPH_NODE_TYPES = "XNNGraph" [
        ("version", Unread),
        ("xnodes", Tables(&NODE_TYPE)),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::verify::{Field, Shape};
    use std::collections::BTreeMap;

    const SCHEMA: &str = include_str!("../../schema/xnnpack.fbs");

    fn size_of_scalar(ty: &str, enums: &BTreeMap<&str, &str>) -> Option<u8> {
        let ty = enums.get(ty).copied().unwrap_or(ty);
        Some(match ty {
            "bool" | "byte" | "ubyte" => 1,
            "short" | "ushort" => 2,
            "int" | "uint" | "float" => 4,
            "long" | "ulong" | "double" => 8,
            _ => return None,
        })
    }

    /// Each table of the schema, as the slots' names and what [`describe`] says of them.
    fn schema_tables() -> BTreeMap<String, Vec<(String, String)>> {
        let text: String = SCHEMA
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let blocks = |kind: &str| -> Vec<(String, String)> {
            text.split(&format!("{kind} "))
                .skip(1)
                .filter_map(|rest| {
                    let (name, body) = rest.split_once('{')?;
                    let body = body.split_once('}')?.0;
                    Some((name.trim().to_string(), body.to_string()))
                })
                .collect()
        };
        let enums_owned: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("enum "))
            .filter_map(|l| {
                let (name, base) = l.split_once(':')?;
                Some((name.trim().into(), base.trim_end_matches('{').trim().into()))
            })
            .collect();
        let enums: BTreeMap<&str, &str> = enums_owned
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_str()))
            .collect();
        let unions: BTreeMap<String, Vec<String>> = blocks("union")
            .into_iter()
            .map(|(name, body)| {
                let variants = body
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(|v| v.rsplit(':').next().unwrap().trim().to_string())
                    .collect();
                (name, variants)
            })
            .collect();
        let mut tables = BTreeMap::new();
        for (name, body) in blocks("table") {
            let mut slots = Vec::new();
            for field in body.split(';').map(str::trim).filter(|f| !f.is_empty()) {
                let (field, ty) = field.split_once(':').unwrap();
                let (field, mut ty) = (field.trim().to_string(), ty.trim());
                let deprecated = ty.contains("(deprecated)");
                ty = ty.split('(').next().unwrap().trim();
                let what = if deprecated {
                    "deprecated".to_string()
                } else if let Some(element) = ty.strip_prefix('[') {
                    let element = element.trim_end_matches(']');
                    match size_of_scalar(element, &enums) {
                        Some(n) => format!("scalars{n}"),
                        None => format!("tables {element}"),
                    }
                } else if ty == "string" {
                    "string".into()
                } else if let Some(n) = size_of_scalar(ty, &enums) {
                    format!("scalar{n}")
                } else if let Some(variants) = unions.get(ty) {
                    slots.push((format!("{field}_type"), "union type".into()));
                    format!("union {}", variants.join(" "))
                } else {
                    format!("table {ty}")
                };
                slots.push((field, what));
            }
            tables.insert(name, slots);
        }
        tables
    }

    fn describe(field: Field) -> String {
        match field {
            Field::Scalar(n) => format!("scalar{n}"),
            Field::Scalars(n) => format!("scalars{n}"),
            Field::String => "string".into(),
            Field::Table(s) => format!("table {}", s.name),
            Field::Tables(s) => format!("tables {}", s.name),
            Field::UnionType => "union type".into(),
            Field::Union(variants) => format!(
                "union {}",
                variants
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Field::Deprecated => "deprecated".into(),
            Field::Unread => "unread".into(),
        }
    }

    fn reachable(shape: &'static Shape, seen: &mut BTreeMap<&'static str, &'static Shape>) {
        if seen.insert(shape.name, shape).is_some() {
            return;
        }
        for &(_, field) in shape.fields {
            match field {
                Field::Table(s) | Field::Tables(s) => reachable(s, seen),
                Field::Union(variants) => variants.iter().for_each(|s| reachable(s, seen)),
                _ => {}
            }
        }
    }

    #[test]
    fn the_shapes_are_the_schemas_tables_slot_for_slot() {
        let schema = schema_tables();
        let mut shapes = BTreeMap::new();
        reachable(&super::GRAPH, &mut shapes);
        assert_eq!(
            shapes.keys().copied().collect::<Vec<_>>(),
            schema.keys().map(String::as_str).collect::<Vec<_>>(),
            "every table of the schema is reached from the root, and no other"
        );
        for (name, shape) in shapes {
            let ours: Vec<(String, String)> = shape
                .fields
                .iter()
                .map(|&(field, what)| (field.to_string(), describe(what)))
                .collect();
            assert_eq!(ours, schema[name], "table {name}");
        }
    }

    /// A view's field is its table's in the same slot, or unread; a union's type byte may be
    /// read alone, as a one-byte scalar. Slots past the view's last are unread.
    fn assert_view_of(view: &'static Shape, full: &'static Shape) {
        assert_eq!(view.name, full.name);
        assert!(view.fields.len() <= full.fields.len(), "{}", view.name);
        for (&(name, field), &(full_name, full_field)) in view.fields.iter().zip(full.fields) {
            assert_eq!(name, full_name, "{} slot order", view.name);
            let same = match (field, full_field) {
                (Field::Unread, _) => true,
                (Field::Scalar(1), Field::UnionType) => true,
                (Field::Tables(v), Field::Tables(f)) | (Field::Table(v), Field::Table(f)) => {
                    assert_view_of(v, f);
                    true
                }
                (v, f) => describe(v) == describe(f),
            };
            assert!(
                same,
                "{}.{name}: {} against {}",
                view.name,
                describe(field),
                describe(full_field)
            );
        }
    }

    #[test]
    fn the_node_types_view_reads_its_tables_fields_in_their_slots() {
        assert_view_of(&super::GRAPH_NODE_TYPES, &super::GRAPH);
    }
}
