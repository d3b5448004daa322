//! fp16 graphs on CPUs where this XNNPACK has no fp16 GEMM kernels.
//!
//! XNNPACK 4ea82e5 has fp16 fully connected, convolution and batch matrix multiply kernels on
//! aarch64 only with FEAT_FP16 arithmetic: on an Armv8.0 core (a Cortex-A53) their creation
//! fails with `UnsupportedHardware`. ExecuTorch's newer XNNPACK runs such graphs there by
//! rewriting the subgraph to fp32 inside its optimizer. This delegate does the same while it
//! defines the subgraph, and only where it must: when the graph has such a node on fp16 values
//! and [`runs_fp16_gemm`] says XNNPACK cannot run it. Then
//!
//! - every fp16 value that is not an external input or output is defined as fp32;
//! - fp16 constants are given to XNNPACK as fp32 ([`Conversion::F16ToF32`]): a converted copy,
//!   or for a packed filter a placeholder of the fp32 size, filled (read and converted) only if
//!   the packed-weight cache misses, and looked up by an identity derived from the fp16
//!   source's ([`BlobId::converted`](crate::cache::BlobId::converted)), so a warm launch reads
//!   and converts nothing;
//! - each fp16 external keeps its fp16 value and id, so callers bind the same fp16 tensors: an
//!   input is converted to an fp32 twin before the first node, an output converted from its
//!   twin after the last.
//!
//! On every other CPU the graph is defined as it is.
//!
//! [`runs_fp16_gemm`]: crate::xnn::runs_fp16_gemm

use super::constants::Conversion;
use super::error::{at, DelegateError};
use super::graph::{constant_index, datatype, tensor_of};
use crate::schema::xnn as fb;
use crate::xnn::{Datatype, Subgraph};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Delegates of this process whose fp16 values are computed as fp32.
static DELEGATES: AtomicUsize = AtomicUsize::new(0);

/// How many delegates this process has initialised with their fp16 values computed as fp32,
/// because this XNNPACK has no fp16 GEMM kernels on this CPU (0 wherever it has them).
pub fn fp16_as_fp32_delegates() -> usize {
    DELEGATES.load(Ordering::Relaxed)
}

/// Counts one more delegate computing fp16 as fp32.
pub(super) fn count() {
    DELEGATES.fetch_add(1, Ordering::Relaxed);
}

/// Whether `node` is a layer XNNPACK runs on its GEMM (or, for depthwise convolutions,
/// multiply-accumulate) kernels, which need fp16 arithmetic in fp16.
fn needs_fp16_arithmetic(node: &fb::XNode<'_>) -> bool {
    node.xnode_union_as_xnnfully_connected().is_some()
        || node.xnode_union_as_xnnconv_2d().is_some()
        || node.xnode_union_as_xnndepthwise_conv_2d().is_some()
        || node.xnode_union_as_xnnconv_transpose_2d().is_some()
        || node.xnode_union_as_xnnbatch_matrix_multiply().is_some()
}

/// The datatype of each value, by payload id.
fn datatypes(graph: &fb::XNNGraph<'_>) -> Result<HashMap<u32, Datatype>, DelegateError> {
    let mut out = HashMap::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, _) = tensor_of(v, i)?;
        out.insert(t.id_out(), datatype(t.datatype(), i)?);
    }
    Ok(out)
}

/// Whether `graph`'s fp16 values must be computed as fp32 here: it has a GEMM-class node
/// reading or writing fp16, and XNNPACK has no fp16 GEMM kernels on this CPU (asked once per
/// process). Graphs with no such node are left as they are, whatever the CPU.
pub(super) fn computes_fp16_as_fp32(graph: &fb::XNNGraph<'_>) -> Result<bool, DelegateError> {
    let types = datatypes(graph)?;
    let fp16 = |id: &u32| types.get(id) == Some(&Datatype::Fp16);
    let has_fp16_gemm = graph.xnodes().iter().flatten().any(|node| {
        needs_fp16_arithmetic(&node)
            && super::operators::node_io(&node)
                .is_some_and(|(inputs, outputs)| inputs.iter().chain(&outputs).any(fp16))
    });
    if !has_fp16_gemm {
        return Ok(false);
    }
    let runs = crate::xnn::runs_fp16_gemm().map_err(at(|| "probing fp16 GEMMs".into()))?;
    Ok(!runs)
}

/// The constants (by constant_data index) of fp16 values, with the conversion XNNPACK is given
/// them through.
pub(super) fn fp16_constants(
    graph: &fb::XNNGraph<'_>,
) -> Result<HashMap<usize, Conversion>, DelegateError> {
    let mut out = HashMap::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, _) = tensor_of(v, i)?;
        let index = constant_index(&t);
        if index != 0 && datatype(t.datatype(), i)? == Datatype::Fp16 {
            out.insert(index, Conversion::F16ToF32);
        }
    }
    Ok(out)
}

/// The datatype value `dt` is defined with inside the subgraph: fp32 for fp16 when `as_fp32`.
pub(super) fn internal_datatype(dt: Datatype, as_fp32: bool) -> Datatype {
    if as_fp32 && dt == Datatype::Fp16 {
        Datatype::Fp32
    } else {
        dt
    }
}

/// The conversions between fp16 externals and their fp32 twins (subgraph ids).
#[derive(Debug, Default)]
pub(super) struct Twins {
    /// (external input, its twin): converted before the first node.
    pub(super) inputs: Vec<(u32, u32)>,
    /// (twin, external output): converted after the last node.
    pub(super) outputs: Vec<(u32, u32)>,
}

impl Twins {
    /// Defines the input conversions: before any node reads a twin.
    pub(super) fn define_inputs(&self, g: &mut Subgraph<'_>) -> Result<(), DelegateError> {
        for &(external, twin) in &self.inputs {
            g.define_convert(external, twin)
                .map_err(at(|| format!("fp16 input {external} to fp32")))?;
        }
        Ok(())
    }

    /// Defines the output conversions: after every node that writes a twin.
    pub(super) fn define_outputs(&self, g: &mut Subgraph<'_>) -> Result<(), DelegateError> {
        for &(twin, external) in &self.outputs {
            g.define_convert(twin, external)
                .map_err(at(|| format!("fp32 to fp16 output {external}")))?;
        }
        Ok(())
    }
}
