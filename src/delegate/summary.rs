//! What a delegate payload holds, without building it: its node types and value datatypes, and
//! whether this build runs each (`xnnblob inspect` on a `.pte`).

use super::error::DelegateError;
use super::graph::tensor_of;
use super::operators::{find, may_pack};
use super::payload::{node_types, parse};
use crate::schema::xnn as fb;
use std::collections::BTreeMap;

/// One delegate payload's node types and datatypes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadSummary {
    /// Each node type (its name in ExecuTorch's schema, or `node type N` for one past it), how
    /// many nodes have it, and whether this build defines it.
    pub nodes: Vec<(String, usize, bool)>,
    /// Each value datatype, with its quantization where it has one (`qint8 per tensor`,
    /// `qcint4 per channel`, `qbint4 blockwise`, `qdint8 dynamic`), and how many values have it.
    pub datatypes: Vec<(String, usize)>,
    /// The named keys of the constants the payload reads from named data, in its order.
    pub constant_keys: Vec<String>,
}

impl PayloadSummary {
    /// Whether this build defines every node of the payload.
    pub fn supported(&self) -> bool {
        self.nodes.iter().all(|(_, _, ok)| *ok)
    }
}

/// Summarises a delegate payload (`XH00` header and `XN01` graph).
pub fn summarize(payload: &[u8]) -> Result<PayloadSummary, DelegateError> {
    let parsed = parse(payload)?;
    let mut nodes: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    for node in parsed.graph.xnodes().iter().flatten() {
        let kind = node.xnode_union_type();
        let name = kind
            .variant_name()
            .map_or_else(|| format!("node type {}", kind.0), str::to_string);
        let entry = nodes.entry(name).or_insert((0, find(kind).is_some()));
        entry.0 += 1;
    }
    let mut datatypes: BTreeMap<String, usize> = BTreeMap::new();
    for (i, value) in parsed.graph.xvalues().iter().flatten().enumerate() {
        let (tensor, quantized) = tensor_of(value, i)?;
        let mut name = tensor
            .datatype()
            .variant_name()
            .map_or_else(
                || format!("datatype {}", tensor.datatype().0),
                str::to_string,
            )
            .trim_start_matches("xnn_datatype_")
            .to_string();
        if let Some(q) = quantized {
            let how = match q.quant_params_type() {
                fb::XNNQuantParams::PerTensorQuant => " per tensor",
                fb::XNNQuantParams::PerChannelQuant => " per channel",
                fb::XNNQuantParams::PerChannelGroupQuant => " blockwise",
                fb::XNNQuantParams::PerTokenDynamicQuant => " dynamic",
                _ => "",
            };
            name.push_str(how);
        }
        *datatypes.entry(name).or_default() += 1;
    }
    Ok(PayloadSummary {
        nodes: nodes.into_iter().map(|(n, (c, ok))| (n, c, ok)).collect(),
        datatypes: datatypes.into_iter().collect(),
        constant_keys: keys_of(&parsed.graph),
    })
}

/// Whether a delegate of the payload may pack a weight, and so ask a weights cache for it: a
/// fully connected layer, a convolution or a batch matrix multiply among its nodes. A graph of
/// elementwise operations, poolings, reshapes and the like asks a cache of nothing, so a face
/// need not open one for it.
///
/// Only the payload's framing and its nodes' types are read, and checked as far as they are
/// read: an error says they cannot be, and a payload answered here may still be one an init
/// refuses (with its own error). The rest of the graph is verified once, by the init.
pub fn packs_weights(payload: &[u8]) -> Result<bool, DelegateError> {
    Ok(node_types(payload)?.any(may_pack))
}

/// The named keys of the constants a delegate payload reads from named data, in its order
/// ([`PayloadSummary::constant_keys`] alone: the nodes and values are not walked).
pub fn constant_keys(payload: &[u8]) -> Result<Vec<String>, DelegateError> {
    Ok(keys_of(&parse(payload)?.graph))
}

fn keys_of(graph: &fb::XNNGraph<'_>) -> Vec<String> {
    graph
        .constant_data()
        .iter()
        .flatten()
        .filter_map(|c| c.named_key())
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}
