//! Static reshapes of external inputs, folded into the inputs' binding.
//!
//! XNNPACK runs a static reshape as a copy. Where the reshape reads an external input, the copy
//! is the whole input, every run: ExecuTorch's Llama exports reshape each layer's key and value
//! caches (128 positions x 1024 floats, 512 KiB each) before the attention's batch matrix
//! multiply, 24 copies and 12 MiB per decoded token of a 12-layer decoder. Folded, the
//! reshape's output is declared as the external input itself, with the reshape's shape, and
//! XNNPACK reads the caller's buffer in place.
//!
//! The fold keeps every run the graph accepted, and only those: with no dimension inferred (no
//! 0 in the new shape), XNNPACK's reshape takes exactly the input's declared number of
//! elements at every run, and a reshape keeps the bytes in their order. The runtime binds the
//! caller's shape as before and checks it holds those elements (see
//! [`Subgraph::define_reshaped_input`](crate::xnn::Subgraph::define_reshaped_input)).
//!
//! An external value is never written by XNNPACK, nor reused for another value's memory, so
//! the caller's buffer stays read-only as it was.
//!
//! Folded, the input is read where the reshape's output was read, later than the copy read
//! it. A caller may bind an output over an input the graph has read completely before it
//! writes that output (a state's write-back, see [`crate::state`]), so no reshape is folded
//! when a node between it and the last reader of its output may write an external output, in
//! the order XNNPACK runs the graph once it has fused nodes ([`super::fusion`]): a write-back
//! fused into the node that computes it, or a read moved to the reader of a copy.

use super::fusion::FusedOrder;
use super::graph::{Dims, Values, XNN_FLAG_EXTERNAL_INPUT, dims_of};

/// The reshapes of a graph folded into its inputs: few per graph (none in most), so each is
/// held in a vector sorted by what it is looked up by, where a hash table's allocation and
/// hashing cost more than the search.
#[derive(Debug, Default)]
pub(super) struct Folds {
    /// By the payload id of the reshape's output, ascending: the external input it reads,
    /// whose external id and caller's shape the output takes over.
    outputs: Vec<(u32, FoldedInput)>,
    /// The external inputs folded away (payload ids, ascending): no value of theirs is defined.
    inputs: Vec<u32>,
    /// The folded reshape nodes, by ascending index: not defined.
    nodes: Vec<usize>,
}

/// An external input whose reshape was folded into it.
#[derive(Debug, Clone)]
pub(super) struct FoldedInput {
    /// Its external id.
    pub(super) external_id: u32,
    /// Its declared shape: what the caller binds.
    pub(super) dims: Dims,
}

impl Folds {
    /// The reshapes of the graph of `values` that can be folded: each reads an external input that
    /// nothing else reads, of an unquantized type, and writes an internal value of the same type,
    /// with a new shape of the input's number of elements and no dimension inferred, where no node
    /// may write an external output between the reshape and the last read of its output (`order`,
    /// asked only of a reshape that reads an external input: most graphs have none, and the order
    /// is the init's costliest graph pass). None when fp16 is computed as fp32 (`fp16_as_fp32`): an
    /// fp16 input is converted there, and the converted twin is what the nodes read.
    pub(super) fn of<'o>(
        values: &Values<'_>,
        fp16_as_fp32: bool,
        order: impl Fn() -> &'o FusedOrder<'o>,
    ) -> Folds {
        let mut folds = Folds::default();
        if fp16_as_fp32 {
            return folds;
        }
        for (n, node) in values.graph().xnodes().iter().flatten().enumerate() {
            let Some(r) = node.xnode_union_as_xnnstatic_reshape() else {
                continue;
            };
            // Unquantized values only, each the only one of its id, may be folded.
            if !(values.plain_and_alone(r.input_id()) && values.plain_and_alone(r.output_id())) {
                continue;
            }
            let (Some((_, input)), Some((_, output))) =
                (values.tensor(r.input_id()), values.tensor(r.output_id()))
            else {
                continue;
            };
            let elements = |dims: &[usize]| {
                dims.iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .filter(|&n| n > 0)
            };
            let input_dims = dims_of(&input);
            let output_dims = dims_of(&output);
            // The new shape as the payload states it, compared in place with the output's.
            let new_shape_is_output_dims = r.new_shape().is_some_and(|s| {
                s.len() == output_dims.len()
                    && s.iter()
                        .zip(output_dims.iter())
                        .all(|(d, &o)| d as usize == o)
            });
            let foldable = input.flags() == XNN_FLAG_EXTERNAL_INPUT
                && input.constant_buffer_idx() == 0
                && output.flags() == 0
                && output.constant_buffer_idx() == 0
                && input.datatype() == output.datatype()
                && new_shape_is_output_dims
                && !output_dims.is_empty()
                && !output_dims.contains(&0)
                && elements(&output_dims).is_some()
                && elements(&output_dims) == elements(&input_dims)
                && r.input_id() != r.output_id()
                // The order last: it is the init's costliest graph pass.
                && order().reads(r.input_id()) == 1
                && !(n + 1..=order().last_read(r.output_id()).unwrap_or(n))
                    .any(|m| order().writes_output(m));
            if foldable {
                let folded = FoldedInput {
                    external_id: input.external_id(),
                    dims: input_dims,
                };
                folds.outputs.push((r.output_id(), folded));
                folds.inputs.push(r.input_id());
                folds.nodes.push(n);
            }
        }
        // An input is read once (`reads`), so folded once; two reshapes may write one output
        // (no exporter's graph has them): the last counts, as the last definition would.
        folds.outputs.reverse();
        folds.outputs.sort_by_key(|&(id, _)| id);
        folds.outputs.dedup_by_key(|&mut (id, _)| id);
        folds.inputs.sort_unstable();
        folds
    }

    /// Whether nothing is folded (most graphs): then no value need be looked up here.
    pub(super) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether the external input `id` (payload id) is folded away.
    pub(super) fn folds_input(&self, id: u32) -> bool {
        self.inputs.binary_search(&id).is_ok()
    }

    /// The external input that the output `id` of a folded reshape (payload id) stands for.
    pub(super) fn folded_output(&self, id: u32) -> Option<&FoldedInput> {
        let at = self.outputs.binary_search_by_key(&id, |&(o, _)| o).ok()?;
        Some(&self.outputs[at].1)
    }

    /// The folded reshape nodes, by ascending index.
    pub(super) fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// The outputs of the reshapes folded into the external input `external_id`: reads of
    /// them are reads of the input.
    pub(super) fn read_as(&self, external_id: u32) -> Vec<u32> {
        self.outputs
            .iter()
            .filter(|(_, folded)| folded.external_id == external_id)
            .map(|&(output, _)| output)
            .collect()
    }
}
