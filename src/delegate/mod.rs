//! ExecuTorch's XNNPACK delegate, built on xnnblob: a processed payload (`XH00` + `XN01`
//! graph) becomes an XNNPACK runtime whose constants come from a [`NamedDataMap`] through the
//! backend's shared data cache, and whose packed weights come from the model's packed-weight
//! cache ([`ModelContext`]). The C++ face (`faces/cxx/include/xnnblob/delegate.h`) wraps exactly this.
//!
//! Inputs and outputs are bound by position, in ascending external id (the order ExecuTorch
//! passes a delegate call's arguments in), as tensors of any boundary dtype and of any shape
//! within the declared one.

mod compile;
mod constants;
mod error;
mod fallback;
mod fold;
mod fusion;
mod graph;
pub mod operators;
pub mod payload;
pub mod prepack;
mod remembered;
mod summary;
mod values;
mod weight_identities;

pub use crate::backend::Weights;
pub use compile::InitTimings;
pub use error::DelegateError;
pub use fallback::fp16_as_fp32_delegates;
pub use fusion::Alias;
pub use summary::{PayloadSummary, constant_keys, packs_weights, summarize};

use crate::backend::ModelContext;
use crate::cache::PackedWeightsCache;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::tensor::{Shape, TensorMut, TensorRef};
use crate::xnn::{External, RawInput, RawOutput};
use std::sync::Arc;

/// One initialised delegate (one lowered method or submodule).
pub struct XnnDelegate {
    runtime: compile::OwnedRuntime,
    timings: InitTimings,
    maps: MapCheck,
}

/// The model's packed-weight cache, and how many of its maps were already lost (cut short)
/// when the runtime was created: an execute after another is lost may have read zeros.
struct MapCheck(Option<(Arc<PackedWeightsCache>, usize)>);

impl MapCheck {
    /// Taken before the runtime is created: a map lost by then has its entries forgotten, so
    /// the runtime packs them anew rather than reading zeros.
    fn before_init(model: &ModelContext) -> MapCheck {
        MapCheck(model.packed_cache().map(|c| (c.clone(), c.lost_maps())))
    }

    /// An execute's outcome, failed if a map the runtime may read was lost meanwhile.
    fn after_execute(&self, ran: Result<(), DelegateError>) -> Result<(), DelegateError> {
        ran?;
        match &self.0 {
            Some((cache, lost_before)) => {
                cache.check_maps(*lost_before).map_err(DelegateError::Cache)
            }
            None => Ok(()),
        }
    }
}

impl XnnDelegate {
    /// `init`: validates `processed`, loads its constants from `map` (shared across the
    /// backend), and creates the runtime with the model's packed-weight cache, workspace and
    /// thread pool.
    pub fn init(
        model: &ModelContext,
        processed: DataBuffer,
        map: &dyn NamedDataMap,
    ) -> Result<XnnDelegate, DelegateError> {
        XnnDelegate::init_with_aliases(model, processed, map, &[])
    }

    /// As [`init`](Self::init), for a caller that binds each of `aliases`' outputs over its
    /// input's memory at every execute (a state's write-back, see [`crate::state`]). Fails
    /// with [`DelegateError::Alias`] unless the graph reads each such input completely before
    /// it writes the output; where XNNPACK's operator fusion would write one earlier (a Copy
    /// fused into the node that computes it), the runtime runs the nodes as the graph orders
    /// them.
    pub fn init_with_aliases(
        model: &ModelContext,
        processed: DataBuffer,
        map: &dyn NamedDataMap,
        aliases: &[Alias],
    ) -> Result<XnnDelegate, DelegateError> {
        let maps = MapCheck::before_init(model);
        let (runtime, timings) = compile::compile(processed, map, None, model, aliases)?;
        Ok(XnnDelegate {
            runtime,
            timings,
            maps,
        })
    }

    /// As [`init`](Self::init), reading no constant whose packing the model's packed-weight cache
    /// may hold: each weight XNNPACK only packs, named by content (ExecuTorch's sha256 keys), gets
    /// a placeholder address instead of its bytes, read in from `map` only if the look-up misses
    /// (see [`crate::deferred`]). For maps whose `get_data` reads (copies) rather than maps.
    pub fn init_deferred(
        model: &ModelContext,
        processed: DataBuffer,
        map: Arc<dyn NamedDataMap>,
    ) -> Result<XnnDelegate, DelegateError> {
        let maps = MapCheck::before_init(model);
        let deferred = compile::compile(processed.clone(), &*map, Some(map.clone()), model, &[]);
        let compiled = match deferred {
            // A placeholder's bytes could not be read in when XNNPACK needed them (nothing packed
            // from it was kept): read every constant up front instead, as `init` does.
            Err(DelegateError::UnreadConstant { .. }) => {
                compile::compile(processed, &*map, None, model, &[])
            }
            other => other,
        };
        let (runtime, timings) = compiled?;
        Ok(XnnDelegate {
            runtime,
            timings,
            maps,
        })
    }

    /// Where `init`'s time went.
    pub fn init_timings(&self) -> InitTimings {
        self.timings
    }

    /// Whether this delegate computes its fp16 values as fp32, because the linked XNNPACK has no
    /// fp16 GEMM kernels on this CPU (an Armv8.0 core); its fp16 inputs and outputs are fp16
    /// all the same. False wherever XNNPACK runs the graph as it is.
    pub fn computes_fp16_as_fp32(&self) -> bool {
        self.runtime.borrow_owner().fp16_as_fp32()
    }

    /// The external inputs, by ascending id: dtype, declared bound, last shape.
    pub fn inputs(&self) -> impl ExactSizeIterator<Item = External> + '_ {
        self.runtime.borrow_dependent().inputs()
    }

    /// The external outputs, by ascending id; shapes are those of the last execute.
    pub fn outputs(&self) -> impl ExactSizeIterator<Item = External> + '_ {
        self.runtime.borrow_dependent().outputs()
    }

    /// The declared (largest) shapes of the inputs, in order.
    pub fn input_shapes(&self) -> Vec<Vec<usize>> {
        self.inputs().map(|e| e.bound.dims().to_vec()).collect()
    }

    /// The shapes of the outputs of the last execute (the declared ones before the first).
    pub fn output_shapes(&self) -> Vec<Vec<usize>> {
        self.outputs().map(|e| e.shape.dims().to_vec()).collect()
    }

    /// `execute`: one input and one output per external, by ascending id. Inputs may have any
    /// shape within the declared one (the runtime is reshaped only when a shape changed); each
    /// output's shape is set to what the run produced. Padded inputs and all outputs are bound
    /// in place; nothing is allocated once warm.
    ///
    /// Fails with [`CacheError::Truncated`](crate::cache::CacheError::Truncated) (in
    /// [`DelegateError::Cache`]) if the packed-weight cache's file was cut short under it: the
    /// outputs are then not to be used.
    pub fn execute(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), DelegateError> {
        let ran = self
            .runtime
            .with_dependent_mut(|_, runtime| runtime.execute(inputs, outputs))
            .map_err(execute_error);
        self.maps.after_execute(ran)
    }

    /// Runs on buffers the caller binds by position (state bound in place, C++ spans).
    ///
    /// # Safety
    /// As for [`crate::xnn::Runtime::execute_raw`].
    pub unsafe fn execute_raw(
        &mut self,
        input: impl FnMut(usize) -> RawInput,
        output: impl FnMut(usize) -> RawOutput,
    ) -> Result<(), DelegateError> {
        let ran = self
            .runtime
            .with_dependent_mut(|_, runtime| {
                // SAFETY: forwarded contract.
                unsafe { runtime.execute_raw(input, output) }
            })
            .map_err(execute_error);
        self.maps.after_execute(ran)
    }

    /// As [`execute_raw`](Self::execute_raw), telling `output` each output's shape for this run
    /// first (see [`crate::xnn::Runtime::execute_raw_shaped`]).
    ///
    /// # Safety
    /// As for [`crate::xnn::Runtime::execute_raw`].
    pub unsafe fn execute_raw_shaped(
        &mut self,
        input: impl FnMut(usize) -> RawInput,
        output: impl FnMut(usize, &Shape) -> RawOutput,
    ) -> Result<(), DelegateError> {
        let ran = self
            .runtime
            .with_dependent_mut(|_, runtime| {
                // SAFETY: forwarded contract.
                unsafe { runtime.execute_raw_shaped(input, output) }
            })
            .map_err(execute_error);
        self.maps.after_execute(ran)
    }

    /// A convenience over [`execute`](Self::execute) for fp32 graphs: inputs hold the declared
    /// shapes, outputs their declared sizes. It allocates a little; `execute` does not.
    pub fn execute_f32(
        &mut self,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
    ) -> Result<(), DelegateError> {
        let bounds: Vec<Shape> = self.inputs().map(|e| e.bound).collect();
        let ins: Vec<TensorRef<'_>> = inputs
            .iter()
            .zip(bounds.iter().chain(std::iter::repeat(&Shape::default())))
            .map(|(data, shape)| TensorRef::f32(*shape, data))
            .collect();
        let mut outs: Vec<TensorMut<'_>> = outputs.iter_mut().map(|o| TensorMut::f32(o)).collect();
        self.execute(&ins, &mut outs)
    }
}

fn execute_error(error: crate::xnn::XnnError) -> DelegateError {
    DelegateError::Xnn {
        what: "execute".to_string(),
        error,
    }
}
