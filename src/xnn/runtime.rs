//! An owned XNNPACK runtime: a subgraph made executable, with its weights packed (or found in a
//! weights cache).

use super::error::{check, XnnError};
use super::subgraph::Subgraph;
use super::weights_cache::AsXnnWeightsCache;
use std::marker::PhantomData;
use std::ptr::NonNull;
use xnnpack_sys as sys;

/// XNNPACK may read this many bytes past the end of an input: inputs are staged in buffers that
/// have them.
const EXTRA_FLOATS: usize = sys::XNN_EXTRA_BYTES as usize / std::mem::size_of::<f32>();

/// An executable XNNPACK runtime. `'a` covers the subgraph's static data and the weights cache,
/// both of which XNNPACK keeps pointers into.
pub struct Runtime<'a> {
    raw: NonNull<sys::xnn_runtime>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    /// Padded copies of the inputs, by position in `inputs`.
    staging: Vec<Vec<f32>>,
    reshaped: bool,
    _borrows: PhantomData<&'a ()>,
}

// SAFETY: a runtime may be used from any thread, one at a time (`invoke` takes `&mut self`).
unsafe impl Send for Runtime<'_> {}

impl<'a> Runtime<'a> {
    /// Creates a runtime; with a weights cache, XNNPACK looks packed weights up there (and
    /// packs into it on a miss) instead of packing into private memory.
    pub fn new(
        subgraph: &Subgraph<'a>,
        weights_cache: Option<&'a dyn AsXnnWeightsCache>,
    ) -> Result<Runtime<'a>, XnnError> {
        let cache = weights_cache.map_or(std::ptr::null_mut(), |c| c.as_xnn_weights_cache());
        let mut raw = std::ptr::null_mut();
        // SAFETY: the subgraph is valid; the cache, when given, outlives 'a (its trait
        // contract); no workspace or threadpool; `raw` is a valid out-pointer.
        check("xnn_create_runtime_v4", unsafe {
            sys::xnn_create_runtime_v4(
                subgraph.as_raw(),
                cache,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                &mut raw,
            )
        })?;
        let raw = NonNull::new(raw).ok_or(XnnError::Call {
            call: "xnn_create_runtime_v4",
            status: super::Status::OutOfMemory,
        })?;
        Ok(Runtime {
            raw,
            inputs: subgraph.inputs.clone(),
            outputs: subgraph.outputs.clone(),
            staging: vec![Vec::new(); subgraph.inputs.len()],
            reshaped: false,
            _borrows: PhantomData,
        })
    }

    /// The shape of an external input or output.
    pub fn external_shape(&mut self, id: u32) -> Result<Vec<usize>, XnnError> {
        self.reshape()?;
        let mut dims = [0usize; sys::XNN_MAX_TENSOR_DIMS as usize];
        let mut num_dims = 0usize;
        // SAFETY: `dims` has room for XNN_MAX_TENSOR_DIMS entries, the most XNNPACK writes.
        check("xnn_get_external_value_shape", unsafe {
            sys::xnn_get_external_value_shape(
                self.raw.as_ptr(),
                id,
                &mut num_dims,
                dims.as_mut_ptr(),
            )
        })?;
        Ok(dims[..num_dims.min(dims.len())].to_vec())
    }

    fn reshape(&mut self) -> Result<(), XnnError> {
        if !self.reshaped {
            // SAFETY: the runtime is valid.
            check("xnn_reshape_runtime", unsafe {
                sys::xnn_reshape_runtime(self.raw.as_ptr())
            })?;
            self.reshaped = true;
        }
        Ok(())
    }

    fn expect_elements(&mut self, id: u32, given: usize) -> Result<(), XnnError> {
        let expected = self.external_shape(id)?.iter().product::<usize>();
        if expected != given {
            return Err(XnnError::ExternalSize {
                id,
                expected_elements: expected,
                given_elements: given,
            });
        }
        Ok(())
    }

    /// Runs the graph: every external input and output must be bound exactly once, with a
    /// buffer of the size its shape needs.
    pub fn invoke(
        &mut self,
        inputs: &[(u32, &[f32])],
        outputs: &mut [(u32, &mut [f32])],
    ) -> Result<(), XnnError> {
        // SAFETY: no in-place bindings.
        unsafe { self.invoke_in_place(inputs, outputs, &[]) }
    }

    /// As [`invoke`](Self::invoke), with some externals bound in place to caller memory (state
    /// that XNNPACK reads and writes where it lives, not staged): `(id, pointer, elements)`.
    ///
    /// # Safety
    /// Each pointer must be valid for reads and writes of `elements` f32 plus XNN_EXTRA_BYTES of
    /// reads, for the duration of the call, and not be accessed by anything else meanwhile.
    pub unsafe fn invoke_in_place(
        &mut self,
        inputs: &[(u32, &[f32])],
        outputs: &mut [(u32, &mut [f32])],
        in_place: &[(u32, NonNull<f32>, usize)],
    ) -> Result<(), XnnError> {
        let is_input = |id: &u32| self.inputs.contains(id);
        let placed_inputs = in_place
            .iter()
            .filter(|(id, _, _)| is_input(id))
            .map(|(id, _, _)| *id);
        let placed_outputs = in_place
            .iter()
            .filter(|(id, _, _)| !is_input(id))
            .map(|(id, _, _)| *id);
        bound_exactly_once(
            &self.inputs,
            inputs.iter().map(|(id, _)| *id).chain(placed_inputs),
        )?;
        bound_exactly_once(
            &self.outputs,
            outputs.iter().map(|(id, _)| *id).chain(placed_outputs),
        )?;
        let mut externals = Vec::with_capacity(inputs.len() + outputs.len() + in_place.len());
        for (id, data) in inputs {
            self.expect_elements(*id, data.len())?;
            let slot = self
                .inputs
                .iter()
                .position(|i| i == id)
                .expect("checked above");
            let staged = &mut self.staging[slot];
            staged.clear();
            staged.extend_from_slice(data);
            staged.resize(data.len() + EXTRA_FLOATS, 0.0);
            externals.push(sys::xnn_external_value {
                id: *id,
                data: staged.as_mut_ptr().cast(),
            });
        }
        for (id, data) in outputs.iter_mut() {
            self.expect_elements(*id, data.len())?;
            externals.push(sys::xnn_external_value {
                id: *id,
                data: data.as_mut_ptr().cast(),
            });
        }
        for &(id, ptr, elements) in in_place {
            self.expect_elements(id, elements)?;
            externals.push(sys::xnn_external_value {
                id,
                data: ptr.as_ptr().cast(),
            });
        }
        // SAFETY: every external points to a live buffer of the size its shape needs (staged
        // inputs padded by XNN_EXTRA_BYTES, in-place ones by the caller's contract); they stay
        // valid until invoke returns, and the next invoke sets them up again before running.
        check("xnn_setup_runtime_v2", unsafe {
            sys::xnn_setup_runtime_v2(self.raw.as_ptr(), externals.len(), externals.as_ptr())
        })?;
        // SAFETY: the runtime is set up with the buffers above, which are still valid.
        check("xnn_invoke_runtime", unsafe {
            sys::xnn_invoke_runtime(self.raw.as_ptr())
        })
    }
}

fn bound_exactly_once(
    declared: &[u32],
    given: impl Iterator<Item = u32> + Clone,
) -> Result<(), XnnError> {
    for (n, id) in given.clone().enumerate() {
        if !declared.contains(&id) || given.clone().take(n).any(|prev| prev == id) {
            return Err(XnnError::UnknownExternal { id });
        }
    }
    if let Some(missing) = declared.iter().find(|d| !given.clone().any(|id| id == **d)) {
        return Err(XnnError::MissingExternal { id: *missing });
    }
    Ok(())
}

impl Drop for Runtime<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the runtime and nothing else references it.
        unsafe { sys::xnn_delete_runtime(self.raw.as_ptr()) };
    }
}

/// A runtime that owns everything its subgraph borrowed (weights, scales, the weights cache),
/// so it can be stored and moved freely: a delegate's handle.
pub struct OwnedRuntime<K: Send + 'static> {
    // Declared before `keep`: dropped first, while what it borrows is still alive.
    runtime: Runtime<'static>,
    keep: Box<K>,
}

impl<K: Send + 'static> OwnedRuntime<K> {
    /// Moves `keep` to the heap, builds a subgraph over data borrowed from it with `build`, and
    /// creates the runtime with the weights cache `cache` picks from it. The higher-ranked
    /// closures can only borrow from `keep` (or from `'static` data), which is what makes
    /// owning both sound. `build` may also return owned values `X` (say, registrations that
    /// must live while the runtime is created); they are handed back afterwards.
    pub fn build<E: From<XnnError>, X: 'static>(
        keep: K,
        cache: impl for<'a> FnOnce(&'a K) -> Option<&'a dyn AsXnnWeightsCache>,
        build: impl for<'a> FnOnce(&'a K) -> Result<(Subgraph<'a>, X), E>,
    ) -> Result<(OwnedRuntime<K>, X), E> {
        let keep = Box::new(keep);
        let (runtime, extra) = {
            let k: &K = &keep;
            let (subgraph, extra) = build(k)?;
            (Runtime::new(&subgraph, cache(k))?, extra)
        };
        // SAFETY: the runtime borrows only from `*keep` (the closures are generic over the
        // borrow's lifetime, so they cannot have captured anything shorter-lived) and from
        // 'static data. `keep` is boxed, so its address does not change when it moves into the
        // struct; it is never handed out mutably; and `runtime` is dropped before it (field
        // order). Extending the borrow to 'static is therefore never observable.
        let runtime = unsafe { std::mem::transmute::<Runtime<'_>, Runtime<'static>>(runtime) };
        Ok((OwnedRuntime { runtime, keep }, extra))
    }

    pub fn keep(&self) -> &K {
        &self.keep
    }

    /// See [`Runtime::invoke`].
    pub fn invoke(
        &mut self,
        inputs: &[(u32, &[f32])],
        outputs: &mut [(u32, &mut [f32])],
    ) -> Result<(), XnnError> {
        self.runtime.invoke(inputs, outputs)
    }

    /// See [`Runtime::invoke_in_place`].
    ///
    /// # Safety
    /// As for [`Runtime::invoke_in_place`].
    pub unsafe fn invoke_in_place(
        &mut self,
        inputs: &[(u32, &[f32])],
        outputs: &mut [(u32, &mut [f32])],
        in_place: &[(u32, NonNull<f32>, usize)],
    ) -> Result<(), XnnError> {
        // SAFETY: forwarded contract.
        unsafe { self.runtime.invoke_in_place(inputs, outputs, in_place) }
    }

    /// See [`Runtime::external_shape`].
    pub fn external_shape(&mut self, id: u32) -> Result<Vec<usize>, XnnError> {
        self.runtime.external_shape(id)
    }
}
