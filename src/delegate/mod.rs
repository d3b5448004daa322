//! ExecuTorch's XNNPACK delegate, built on xnnblob: a processed payload (`XH00` + `XN01`
//! graph) becomes an XNNPACK runtime whose constants come from a [`NamedDataMap`] through the
//! backend's [`SharedDataCache`], and whose packed weights come from a [`PackedWeightsCache`].
//! The C++ face (`cpp/include/xnnblob/delegate.h`) wraps exactly this.

pub mod builder;
mod compile;
mod error;
pub mod payload;

pub use compile::{InitTimings, Weights};
pub use error::DelegateError;

use crate::cache::PackedWeightsCache;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::shared_cache::SharedDataCache;
use crate::xnn::OwnedRuntime;
use std::sync::Arc;

/// An external input or output: its id and shape.
pub type External = (u32, Vec<usize>);

/// One initialised delegate (one lowered method or submodule).
pub struct XnnDelegate {
    runtime: OwnedRuntime<compile::Keep>,
    io: compile::Io,
}

impl XnnDelegate {
    /// `init`: validates `processed`, loads its constants (shared across delegates through
    /// `shared`), and creates the runtime (packed weights found in or added to `weights`).
    pub fn init(
        processed: DataBuffer,
        map: &dyn NamedDataMap,
        shared: &SharedDataCache,
        weights: Option<Arc<PackedWeightsCache>>,
    ) -> Result<XnnDelegate, DelegateError> {
        let weights = weights.map_or(Weights::None, Weights::Packed);
        XnnDelegate::init_with(processed, map, shared, weights)
    }

    /// As [`init`](Self::init), with any weights cache (XNNPACK's own, or none).
    pub fn init_with(
        processed: DataBuffer,
        map: &dyn NamedDataMap,
        shared: &SharedDataCache,
        weights: Weights,
    ) -> Result<XnnDelegate, DelegateError> {
        let (runtime, io) = compile::compile(processed, map, shared, weights)?;
        Ok(XnnDelegate { runtime, io })
    }

    /// Where `init`'s time went.
    pub fn init_timings(&self) -> InitTimings {
        self.io.timings
    }

    /// Shapes of the inputs, in order.
    pub fn input_shapes(&self) -> Vec<Vec<usize>> {
        self.io.inputs.iter().map(|(_, d)| d.clone()).collect()
    }

    /// Shapes of the outputs, in order.
    pub fn output_shapes(&self) -> Vec<Vec<usize>> {
        self.io.outputs.iter().map(|(_, d)| d.clone()).collect()
    }

    /// The external ids and shapes of the inputs and of the outputs, in execute order.
    pub fn externals(&self) -> (&[External], &[External]) {
        (&self.io.inputs, &self.io.outputs)
    }

    /// Runs the graph with externals given by id; some bound in place to caller memory (state).
    ///
    /// # Safety
    /// As for [`crate::xnn::Runtime::invoke_in_place`].
    pub unsafe fn execute_in_place(
        &mut self,
        inputs: &[(u32, &[f32])],
        outputs: &mut [(u32, &mut [f32])],
        in_place: &[(u32, std::ptr::NonNull<f32>, usize)],
    ) -> Result<(), DelegateError> {
        // SAFETY: forwarded contract.
        unsafe { self.runtime.invoke_in_place(inputs, outputs, in_place) }?;
        Ok(())
    }

    /// `execute`: runs the graph on fp32 inputs, writing fp32 outputs, both in payload order.
    pub fn execute(
        &mut self,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
    ) -> Result<(), DelegateError> {
        if inputs.len() != self.io.inputs.len() {
            return Err(DelegateError::Arity {
                what: "inputs",
                expected: self.io.inputs.len(),
                given: inputs.len(),
            });
        }
        if outputs.len() != self.io.outputs.len() {
            return Err(DelegateError::Arity {
                what: "outputs",
                expected: self.io.outputs.len(),
                given: outputs.len(),
            });
        }
        let ins: Vec<(u32, &[f32])> = self
            .io
            .inputs
            .iter()
            .zip(inputs)
            .map(|((id, _), d)| (*id, *d))
            .collect();
        let mut outs: Vec<(u32, &mut [f32])> = self
            .io
            .outputs
            .iter()
            .zip(outputs.iter_mut())
            .map(|((id, _), d)| (*id, &mut **d))
            .collect();
        self.runtime.invoke(&ins, &mut outs)?;
        Ok(())
    }
}
