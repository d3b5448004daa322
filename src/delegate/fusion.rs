//! Where XNNPACK's operator fusion moves a graph's reads and writes, and the outputs a caller
//! binds over inputs ([`Alias`]) that it could break.
//!
//! `xnn_create_runtime_v4` fuses nodes before it runs them (`xnn_subgraph_fusion` in XNNPACK
//! 4ea82e5), and two of its fusions change when a value is read or written:
//!
//! - A Copy or a Clamp whose input is an internal value is fused into the node that produces
//!   that value, which then writes the Copy's or the Clamp's output itself: an external output
//!   written by a Copy at the end of a graph (a state's write-back) is written where its source
//!   was computed, maybe before a later node reads the input the output is bound over.
//! - A Copy whose output is an internal value is fused into the node that reads that value,
//!   which then reads the Copy's input itself: the input is read later than the Copy read it.
//!   So is a constant pad into the convolution that reads it.
//!
//! XNNPACK fuses only where the value between has one reader (an external output counts one
//! more) and, for a Clamp, only into nodes with a clamp of their own (a pad only when it pads
//! with zeros the spatial dimensions alone). The bounds here ignore those conditions, so they
//! hold whatever XNNPACK decides: a node may write an external output when it does in the
//! payload, or when its output goes, through Copies and Clamps, into one; a value's last read
//! is that of its last reader, or of a reader of a Copy or a pad of it. A graph whose nodes
//! read a value before the node that writes it is given the widest bounds: every node may
//! write an output, and every value is read until the end.

use super::DelegateError;
use super::graph::{ById, Values, XNN_FLAG_EXTERNAL_INPUT, XNN_FLAG_EXTERNAL_OUTPUT};
use crate::schema::xnn as fb;

/// An external output the caller binds over an external input's memory at every execute (a
/// state's write-back), by external ids. The graph must read the input completely before it
/// writes the output; [`XnnDelegate::init_with_aliases`](super::XnnDelegate::init_with_aliases)
/// checks that it does, and keeps XNNPACK from fusing the write earlier where it would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias {
    /// The external input's id.
    pub input: u32,
    /// The external output's id.
    pub output: u32,
}

/// Whether XNNPACK may fuse the graph's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fusion {
    /// Every alias holds however XNNPACK fuses.
    Allowed,
    /// An alias holds only in the payload's order: the runtime is made with XNNPACK's operator
    /// fusion off (`XNN_FLAG_NO_OPERATOR_FUSION`).
    Off,
}

/// How fusion may remove a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Fusable {
    /// Into its input's producer, which then writes its output: a Copy or a Clamp.
    into_producer: bool,
    /// Into its output's reader, which then reads its input: a Copy, or a constant pad read by
    /// a convolution.
    into_reader: bool,
}

/// A Convert is counted as a Copy: between two fp32 values xnnblob defines it as one.
fn fusable(node: &fb::XNode<'_>) -> Fusable {
    match node.xnode_union_type() {
        fb::XNodeUnion::XNNCopy | fb::XNodeUnion::XNNConvert => Fusable {
            into_producer: true,
            into_reader: true,
        },
        fb::XNodeUnion::XNNClamp => Fusable {
            into_producer: true,
            into_reader: false,
        },
        fb::XNodeUnion::XNNStaticConstantPad => Fusable {
            into_producer: false,
            into_reader: true,
        },
        _ => Fusable::default(),
    }
}

/// A graph's reads and writes, in the payload's order and as XNNPACK may run it.
///
/// Values are held by payload id in one [`ById`] table (dense where the ids are), each entry
/// holding all that is known of its value: the init asks for the order of every graph with a
/// reshape of an external input, a ViT's every delegate, and a table per fact was most of the
/// cost of asking.
pub(super) struct FusedOrder<'a> {
    /// By node index: the values it reads and writes (payload ids).
    io: &'a super::operators::GraphIo,
    /// By node index: how fusion may remove it.
    kinds: Vec<Fusable>,
    /// By value: its flags, writer and reads.
    values: ById<ValueOrder>,
    /// External values as (external id, is an input, payload id), sorted by the first two and,
    /// among equals, in the payload's order: searched for each alias of the call.
    externals: Vec<(u32, bool, u32)>,
    /// The graph reads a value before it writes it: an output may be written anywhere.
    first_write_anywhere: bool,
    /// By node index: whether it may write an external output once fused.
    writes_output: Vec<bool>,
}

/// What a [`FusedOrder`] knows of one value.
#[derive(Debug, Clone, Copy, Default)]
struct ValueOrder {
    /// Its flags, where a value of the payload defines it.
    flags: Option<u32>,
    /// The first node that writes it in the payload.
    writer: Option<usize>,
    /// How many times nodes read it in the payload (a node once per read).
    reads: usize,
    /// The last node that reads it in the payload.
    payload_last_read: Option<usize>,
    /// The last node that may read it once fused.
    last_read: Option<usize>,
    /// Some reader of it may be fused into its producer, and then write an external output.
    into_writing_reader: bool,
}

impl ValueOrder {
    /// Whether it may be an external output: it is one, or no value defines it.
    fn may_be_external_output(&self) -> bool {
        self.flags.is_none_or(|f| f & XNN_FLAG_EXTERNAL_OUTPUT != 0)
    }
}

impl<'a> FusedOrder<'a> {
    /// The order of the reads and writes of the nodes of the graph of `values` (a node whose
    /// inputs and outputs cannot be told reads and writes nothing; `check_nodes` refuses such
    /// graphs first).
    pub(super) fn of(values: &Values<'_>, io: &'a super::operators::GraphIo) -> Self {
        let graph = values.graph();
        let nodes = graph.xnodes().map_or(0, |n| n.len());
        let kinds: Vec<Fusable> = graph
            .xnodes()
            .iter()
            .flatten()
            .map(|n| fusable(&n))
            .collect();
        let count = values.tensors().count();
        let mut order = ById::new(values.largest(), count);
        let mut externals = Vec::new();
        for (_, t) in values.tensors() {
            order
                .get_or_insert_with(t.id_out(), ValueOrder::default)
                .flags = Some(t.flags());
            if t.flags() & XNN_FLAG_EXTERNAL_INPUT != 0 {
                externals.push((t.external_id(), true, t.id_out()));
            }
            if t.flags() & XNN_FLAG_EXTERNAL_OUTPUT != 0 {
                externals.push((t.external_id(), false, t.id_out()));
            }
        }
        // Stable: values claiming one external id keep the payload's order.
        externals.sort_by_key(|&(external_id, input, _)| (external_id, input));
        for n in 0..nodes {
            let (inputs, outputs) = io.node(n).unwrap_or_default();
            for &input in inputs {
                let v = order.get_or_insert_with(input, ValueOrder::default);
                v.reads += 1;
                // Nodes come in index order: the last to read is the last seen.
                v.payload_last_read = Some(n);
                v.last_read = Some(n);
            }
            for &output in outputs {
                let v = order.get_or_insert_with(output, ValueOrder::default);
                v.writer.get_or_insert(n);
            }
        }
        // In order: every value a node reads is written by an earlier node, or by none.
        let in_order = (0..nodes).all(|n| {
            io.node(n)
                .unwrap_or_default()
                .0
                .iter()
                .all(|&v| order.get(v).and_then(|v| v.writer).is_none_or(|w| w < n))
        });
        let writes_output = if in_order {
            fused_bounds(io, nodes, &kinds, &mut order)
        } else {
            let end = nodes.saturating_sub(1);
            order.for_each_mut(|v| {
                if v.payload_last_read.is_some() {
                    v.last_read = Some(end);
                }
            });
            vec![true; nodes]
        };
        FusedOrder {
            io,
            kinds,
            values: order,
            externals,
            first_write_anywhere: !in_order,
            writes_output,
        }
    }

    /// Node `n`'s reads and writes.
    fn node(&self, n: usize) -> (&'a [u32], &'a [u32]) {
        self.io.node(n).unwrap_or_default()
    }

    fn value(&self, value: u32) -> Option<&ValueOrder> {
        self.values.get(value)
    }

    /// How many times nodes read `value` in the payload.
    pub(super) fn reads(&self, value: u32) -> usize {
        self.value(value).map_or(0, |v| v.reads)
    }

    /// Whether node `n` may write an external output.
    pub(super) fn writes_output(&self, n: usize) -> bool {
        self.writes_output.get(n).copied().unwrap_or(true)
    }

    /// The last node that may read `value`; None if none reads it.
    pub(super) fn last_read(&self, value: u32) -> Option<usize> {
        self.value(value)?.last_read
    }

    /// The payload id of the external value with external id `external_id`, an input where
    /// `input`, else an output.
    fn external(&self, external_id: u32, input: bool) -> Option<u32> {
        // The last value that claims the external id, as the last definition would.
        let end = self
            .externals
            .partition_point(|&(e, is_input, _)| (e, is_input) <= (external_id, input));
        let &(e, is_input, id) = self.externals.get(end.checked_sub(1)?)?;
        ((e, is_input) == (external_id, input)).then_some(id)
    }

    /// The first node that may write `value` once fused: its writer, or the producer of that
    /// writer's input, through Copies and Clamps of internal values.
    fn first_write(&self, value: u32) -> Option<usize> {
        let internal = |v: &u32| {
            self.value(*v)
                .and_then(|v| v.flags)
                .is_some_and(|f| f & (XNN_FLAG_EXTERNAL_INPUT | XNN_FLAG_EXTERNAL_OUTPUT) == 0)
        };
        let mut at = self.value(value)?.writer?;
        if self.first_write_anywhere {
            return Some(0);
        }
        loop {
            let (inputs, _) = self.node(at);
            let into_producer = self.kinds.get(at).is_some_and(|k| k.into_producer);
            let source = match inputs {
                [x] if into_producer && internal(x) => self.value(*x).and_then(|v| v.writer),
                _ => None,
            };
            match source {
                // In a graph in order a producer comes before its reader: the walk ends.
                Some(p) if p < at => at = p,
                _ => return Some(at),
            }
        }
    }

    /// Whether XNNPACK may fuse this graph, whose caller binds each of `aliases` (the output
    /// over the input). `read_as(input)`: the values that stand for the input `input` (by
    /// external id) besides its own, the outputs of reshapes folded into it.
    ///
    /// Fails when an alias does not hold even in the payload's order: a node writes its output
    /// before, or where, the input is last read; or it names no such external.
    ///
    /// Where fp16 is computed as fp32 (`fp16_as_fp32`), an fp16 input is converted into an
    /// internal twin before the first node, and a Copy from it may be fused into that Convert:
    /// the payload's external values are not XNNPACK's, and fusion is turned off for any alias.
    pub(super) fn fusion_for(
        &self,
        aliases: &[Alias],
        read_as: impl Fn(u32) -> Vec<u32>,
        fp16_as_fp32: bool,
    ) -> Result<Fusion, DelegateError> {
        let mut fusion = Fusion::Allowed;
        for alias in aliases {
            let refuse = |why: String| DelegateError::Alias {
                input: alias.input,
                output: alias.output,
                why,
            };
            let input = self
                .external(alias.input, true)
                .ok_or_else(|| refuse("the graph has no such input".into()))?;
            let output = self
                .external(alias.output, false)
                .ok_or_else(|| refuse("the graph has no such output".into()))?;
            let reads: Vec<u32> = std::iter::once(input).chain(read_as(alias.input)).collect();
            let last = |of: fn(&ValueOrder) -> Option<usize>| {
                reads.iter().filter_map(|&v| of(self.value(v)?)).max()
            };
            let (Some(written), Some(fused_write)) = (
                self.value(output).and_then(|v| v.writer),
                self.first_write(output),
            ) else {
                // Nothing writes the output: nothing is written over the input.
                continue;
            };
            if !fp16_as_fp32 && last(|v| v.last_read).is_none_or(|r| fused_write > r) {
                continue;
            }
            match last(|v| v.payload_last_read) {
                Some(r) if written <= r => {
                    return Err(refuse(format!(
                        "node {written} writes the output, and node {r} reads the input"
                    )));
                }
                _ => fusion = Fusion::Off,
            }
        }
        Ok(fusion)
    }
}

/// `FusedOrder`'s bounds of a graph in order: by node, whether it may write an external output
/// (returned); by value, the last node that may read it (`last_read` of each in `order`, which
/// starts as the payload's).
fn fused_bounds(
    io: &super::operators::GraphIo,
    nodes: usize,
    kinds: &[Fusable],
    order: &mut ById<ValueOrder>,
) -> Vec<bool> {
    let external_output = |order: &ById<ValueOrder>, v: u32| {
        order.get(v).is_none_or(ValueOrder::may_be_external_output)
    };
    let mut writes_output: Vec<bool> = (0..nodes)
        .map(|n| {
            let (_, outputs) = io.node(n).unwrap_or_default();
            outputs.iter().any(|&v| external_output(order, v))
        })
        .collect();
    // Backwards, so that what a later node may do is known when its producer is reached: in
    // a graph in order, a value's readers come after its producer. A value is marked
    // `into_writing_reader` as each reader of it that may be fused into its producer, and then
    // write an external output, is passed.
    for n in (0..nodes).rev() {
        let (inputs, outputs) = io.node(n).unwrap_or_default();
        if !writes_output[n] {
            writes_output[n] = outputs.iter().any(|&v| {
                !external_output(order, v) && order.get(v).is_some_and(|v| v.into_writing_reader)
            });
        }
        if kinds.get(n).is_some_and(|k| k.into_producer) && writes_output[n] {
            for &input in inputs {
                order
                    .get_or_insert_with(input, ValueOrder::default)
                    .into_writing_reader = true;
            }
        }
        if kinds.get(n).is_some_and(|k| k.into_reader) {
            // Its readers may read its input instead.
            let later = outputs
                .iter()
                .filter(|&&v| !external_output(order, v))
                .filter_map(|&v| order.get(v)?.last_read)
                .max();
            if let Some(later) = later {
                for &input in inputs {
                    let v = order.get_or_insert_with(input, ValueOrder::default);
                    v.last_read = Some(v.last_read.map_or(later, |at| at.max(later)));
                }
            }
        }
    }
    writes_output
}
