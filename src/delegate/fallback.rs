//! fp16 graphs on CPUs where this XNNPACK has no fp16 arithmetic kernels.
//!
//! XNNPACK 4ea82e5 has most of its fp16 kernels on aarch64 only with FEAT_FP16 arithmetic. On
//! an Armv8.0 core (a Cortex-A53) it creates fp16 element-wise operators (add, sigmoid, tanh:
//! they convert to fp32), but fully connected, convolution, batch matrix multiply, softmax,
//! pooling, bilinear resize and reductions fail with `UnsupportedHardware`. ExecuTorch's newer
//! XNNPACK runs such graphs there by rewriting them to fp32 inside its subgraph optimizer, node
//! by node. This delegate does it for the whole graph while it defines the subgraph, and only
//! where it must: when the graph has an fp16 value and [`runs_fp16_gemm`] says XNNPACK has no
//! fp16 GEMMs here (the mark of a CPU without fp16 arithmetic). Then
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
//! The whole graph rather than the nodes without kernels: XNNPACK does not say which nodes those
//! are before runtime creation fails, and computing element-wise nodes in fp32 too only rounds
//! less. On every other CPU the graph is defined as it is.
//!
//! [`runs_fp16_gemm`]: crate::xnn::runs_fp16_gemm

use super::constants::Conversion;
use super::error::{DelegateError, at};
use super::graph::{Values, constant_index, datatype};
use crate::fast_hash::FastMap;
use crate::xnn::{Datatype, Subgraph};
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

/// Whether `graph`'s fp16 values must be computed as fp32 here: it has an unquantized fp16
/// value, and XNNPACK has no fp16 GEMM kernels on this CPU (asked once per process, and only for
/// graphs with fp16 values).
pub(super) fn computes_fp16_as_fp32(values: &Values<'_>) -> Result<bool, DelegateError> {
    let mut has_fp16 = false;
    for each in values.each() {
        let (i, (t, q)) = each?;
        has_fp16 |= q.is_none() && datatype(t.datatype(), i)? == Datatype::Fp16;
    }
    if !has_fp16 {
        return Ok(false);
    }
    let runs = crate::xnn::runs_fp16_gemm().map_err(at(|| "probing fp16 GEMMs".into()))?;
    Ok(!runs)
}

/// The constants (by constant_data index) of fp16 values, with the conversion XNNPACK is given
/// them through.
pub(super) fn fp16_constants(
    values: &Values<'_>,
) -> Result<FastMap<usize, Conversion>, DelegateError> {
    let mut out = FastMap::default();
    for each in values.each() {
        let (i, (t, _)) = each?;
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
