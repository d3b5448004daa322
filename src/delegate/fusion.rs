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
use crate::fast_hash::FastMap;
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
/// Values are held by payload id in [`ById`] tables (dense where the ids are): the init asks
/// for the order of every graph with a reshape of an external input, a ViT's every delegate.
#[derive(Debug)]
pub(super) struct FusedOrder<'a> {
    /// By node index: the values it reads and writes (payload ids), as the init's [`GraphIo`]
    /// holds them.
    ///
    /// [`GraphIo`]: super::operators::GraphIo
    io: Vec<(&'a [u32], &'a [u32])>,
    /// By value: its flags.
    flags: ById<u32>,
    /// By external id: the values of the external inputs, and of the external outputs.
    external_inputs: FastMap<u32, u32>,
    external_outputs: FastMap<u32, u32>,
    /// By value: the first node that writes it in the payload.
    writer: ById<usize>,
    /// By value: how many times nodes read it in the payload (a node once per read).
    reads: ById<usize>,
    /// By value: the last node that reads it in the payload.
    payload_last_read: ById<usize>,
    /// By node index: whether it may be fused into its input's producer.
    into_producer: Vec<bool>,
    /// The graph reads a value before it writes it: an output may be written anywhere.
    first_write_anywhere: bool,
    /// By node index: whether it may write an external output once fused.
    writes_output: Vec<bool>,
    /// By value: the last node that may read it once fused.
    last_read: ById<usize>,
}

impl<'a> FusedOrder<'a> {
    /// The order of the reads and writes of the nodes of the graph of `values` (a node whose
    /// inputs and outputs cannot be told reads and writes nothing; `check_nodes` refuses such
    /// graphs first).
    pub(super) fn of(values: &Values<'_>, io: &'a super::operators::GraphIo) -> Self {
        let graph = values.graph();
        let nodes = graph.xnodes().map_or(0, |n| n.len());
        let io: Vec<(&[u32], &[u32])> =
            (0..nodes).map(|n| io.node(n).unwrap_or_default()).collect();
        let kinds: Vec<Fusable> = graph
            .xnodes()
            .iter()
            .flatten()
            .map(|n| fusable(&n))
            .collect();
        let largest = io
            .iter()
            .flat_map(|(inputs, outputs)| inputs.iter().chain(outputs.iter()).copied())
            .max()
            .unwrap_or(0)
            .max(values.largest());
        let count = values.tensors().count();
        let mut flags = ById::new(largest, count);
        let (mut external_inputs, mut external_outputs) = (FastMap::default(), FastMap::default());
        for (_, t) in values.tensors() {
            flags.insert(t.id_out(), t.flags());
            if t.flags() & XNN_FLAG_EXTERNAL_INPUT != 0 {
                external_inputs.insert(t.external_id(), t.id_out());
            }
            if t.flags() & XNN_FLAG_EXTERNAL_OUTPUT != 0 {
                external_outputs.insert(t.external_id(), t.id_out());
            }
        }
        // A value without flags counts as an external output: it may be one.
        let external_output = |v: &u32| {
            flags
                .get(*v)
                .is_none_or(|f| f & XNN_FLAG_EXTERNAL_OUTPUT != 0)
        };
        let mut reads: ById<usize> = ById::new(largest, count);
        let mut payload_last_read: ById<usize> = ById::new(largest, count);
        let mut writer: ById<usize> = ById::new(largest, count);
        for (n, &(inputs, outputs)) in io.iter().enumerate() {
            for &input in inputs {
                *reads.get_or_insert_with(input, || 0) += 1;
                // Nodes come in index order: the last to read is the last seen.
                payload_last_read.insert(input, n);
            }
            for &output in outputs {
                writer.get_or_insert_with(output, || n);
            }
        }
        let in_order = io
            .iter()
            .enumerate()
            .all(|(n, (inputs, _))| inputs.iter().all(|v| writer.get(*v).is_none_or(|&w| w < n)));
        let (writes_output, last_read) = if in_order {
            fused_bounds(
                &io,
                &kinds,
                &payload_last_read,
                largest,
                count,
                external_output,
            )
        } else {
            let end = io.len().saturating_sub(1);
            let mut last_read = ById::new(largest, count);
            for (v, _) in payload_last_read.iter() {
                last_read.insert(v, end);
            }
            (vec![true; io.len()], last_read)
        };
        FusedOrder {
            io,
            flags,
            external_inputs,
            external_outputs,
            writer,
            reads,
            payload_last_read,
            into_producer: kinds.iter().map(|k| k.into_producer).collect(),
            first_write_anywhere: !in_order,
            writes_output,
            last_read,
        }
    }

    /// How many times nodes read `value` in the payload.
    pub(super) fn reads(&self, value: u32) -> usize {
        self.reads.get(value).copied().unwrap_or(0)
    }

    /// Whether node `n` may write an external output.
    pub(super) fn writes_output(&self, n: usize) -> bool {
        self.writes_output.get(n).copied().unwrap_or(true)
    }

    /// The last node that may read `value`; None if none reads it.
    pub(super) fn last_read(&self, value: u32) -> Option<usize> {
        self.last_read.get(value).copied()
    }

    /// The first node that may write `value` once fused: its writer, or the producer of that
    /// writer's input, through Copies and Clamps of internal values.
    fn first_write(&self, value: u32) -> Option<usize> {
        let internal = |v: &u32| {
            self.flags
                .get(*v)
                .is_some_and(|f| f & (XNN_FLAG_EXTERNAL_INPUT | XNN_FLAG_EXTERNAL_OUTPUT) == 0)
        };
        let mut at = *self.writer.get(value)?;
        if self.first_write_anywhere {
            return Some(0);
        }
        loop {
            let (inputs, _) = self.io[at];
            let source = match inputs {
                [x] if self.into_producer[at] && internal(x) => self.writer.get(*x).copied(),
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
            let input = *self
                .external_inputs
                .get(&alias.input)
                .ok_or_else(|| refuse("the graph has no such input".into()))?;
            let output = *self
                .external_outputs
                .get(&alias.output)
                .ok_or_else(|| refuse("the graph has no such output".into()))?;
            let reads: Vec<u32> = std::iter::once(input).chain(read_as(alias.input)).collect();
            let last = |of: &ById<usize>| reads.iter().filter_map(|&v| of.get(v).copied()).max();
            let (Some(written), Some(fused_write)) =
                (self.writer.get(output), self.first_write(output))
            else {
                // Nothing writes the output: nothing is written over the input.
                continue;
            };
            if !fp16_as_fp32 && last(&self.last_read).is_none_or(|r| fused_write > r) {
                continue;
            }
            match last(&self.payload_last_read) {
                Some(r) if *written <= r => {
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

/// `FusedOrder`'s bounds of a graph in order: by node, whether it may write an external output;
/// by value, the last node that may read it.
fn fused_bounds(
    io: &[(&[u32], &[u32])],
    kinds: &[Fusable],
    payload_last_read: &ById<usize>,
    largest: u32,
    count: usize,
    external_output: impl Fn(&u32) -> bool,
) -> (Vec<bool>, ById<usize>) {
    let mut last_read = payload_last_read.clone();
    let mut writes_output: Vec<bool> = io
        .iter()
        .map(|(_, outputs)| outputs.iter().any(&external_output))
        .collect();
    // The values some reader of which is fused into the value's producer and then may write an
    // external output: marked as each such reader is passed.
    let mut into_writing_reader: ById<()> = ById::new(largest, count);
    // Backwards, so that what a later node may do is known when its producer is reached: in
    // a graph in order, a value's readers come after its producer.
    for n in (0..io.len()).rev() {
        let (inputs, outputs) = io[n];
        if !writes_output[n] {
            writes_output[n] = outputs
                .iter()
                .filter(|v| !external_output(v))
                .any(|&v| into_writing_reader.contains(v));
        }
        if kinds.get(n).is_some_and(|k| k.into_producer) && writes_output[n] {
            for &input in inputs {
                into_writing_reader.insert(input, ());
            }
        }
        if kinds.get(n).is_some_and(|k| k.into_reader) {
            // Its readers may read its input instead.
            let later = outputs
                .iter()
                .filter(|v| !external_output(v))
                .filter_map(|&v| last_read.get(v).copied())
                .max();
            if let Some(later) = later {
                for &input in inputs {
                    let at = last_read.get_or_insert_with(input, || later);
                    *at = (*at).max(later);
                }
            }
        }
    }
    (writes_output, last_read)
}
