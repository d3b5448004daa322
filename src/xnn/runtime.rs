//! An owned XNNPACK runtime: a subgraph made executable, with its weights packed (or found in a
//! weights cache), run on caller buffers of any boundary dtype and of any shape within the
//! declared one.
//!
//! Each run reshapes only when an input's shape changed, binds buffers that have XNNPACK's
//! over-read slack in place (others are copied once into a staging buffer made on first use),
//! and allocates nothing once warm.

use super::error::{XnnError, check};
use super::subgraph::{ExternalDecl, Subgraph};
use super::threadpool::Threadpool;
use super::weights_provider::AsXnnWeightsCache;
use super::workspace::Workspace;
use crate::aligned::AlignedBytes;
use crate::tensor::{DType, Shape, ShapeMismatch, TensorMut, TensorRef, XNN_EXTRA_BYTES};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use xnnpack_sys as sys;

/// What a runtime runs on besides its subgraph.
#[derive(Clone, Default)]
pub struct RuntimeOptions {
    /// Shared with other runtimes (None: a private one).
    pub workspace: Option<Arc<Workspace>>,
    /// None: operators run on the calling thread.
    pub threadpool: Option<Arc<Threadpool>>,
    /// Runs every node as the subgraph defines it, with XNNPACK's operator fusion off: a Copy
    /// or a Clamp is not fused into the node before or after it, which would move the write of
    /// its output earlier or the read of its input later (see `execute_raw`'s contract).
    pub keep_node_order: bool,
}

/// `xnn_create_runtime_v4`'s flag that turns its operator fusion off. XNNPACK 4ea82e5 defines
/// it in an internal header (`src/xnnpack/subgraph.h`), not in `xnnpack.h`, and passes the
/// runtime's flags on to its subgraph optimizer, which reads it.
const XNN_FLAG_NO_OPERATOR_FUSION: u32 = 0x8000_0000;

/// One external input or output: its declaration and its current shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct External {
    /// Its external value id in the subgraph.
    pub id: u32,
    /// The element type of the buffers bound to it.
    pub dtype: DType,
    /// The declared shape, the largest accepted in each dimension.
    pub bound: Shape,
    /// The shape of the last run (of the declaration before the first).
    pub shape: Shape,
}

/// An external as the runtime keeps it: its shape of the last run is kept apart, and only once
/// one differs from its bound (see `Runtime::shapes`).
#[derive(Clone, Copy)]
struct Declared {
    id: u32,
    dtype: DType,
    bound: Shape,
    /// Read by XNNPACK under another shape (see `Subgraph::define_reshaped_input`): bound
    /// with exactly its bound's elements, never reshaped.
    reshaped: bool,
}

/// An input as the runtime binds it.
#[derive(Clone, Copy)]
pub struct RawInput {
    /// The first byte of the input tensor.
    pub data: *const u8,
    /// Readable bytes at `data` (not counting slack).
    pub len: usize,
    /// The element type of the bytes; must be the graph's for this input.
    pub dtype: DType,
    /// The shape of the tensor for this run; must fit within the declared bound.
    pub shape: Shape,
    /// XNN_EXTRA_BYTES past `data + len` are readable too.
    pub padded: bool,
}

/// An output as the runtime binds it.
#[derive(Clone, Copy)]
pub struct RawOutput {
    /// Where the output tensor is written.
    pub data: *mut u8,
    /// Writable bytes at `data`.
    pub capacity: usize,
    /// The element type the caller expects; must be the graph's for this output.
    pub dtype: DType,
}

/// An executable XNNPACK runtime. `'a` covers the subgraph's static data and the weights cache,
/// both of which XNNPACK keeps pointers into.
pub struct Runtime<'a> {
    raw: NonNull<sys::xnn_runtime>,
    /// The inputs then the outputs, each sorted by external id: the order ExecuTorch binds a
    /// delegate call's arguments in. One exact allocation: a decoder holds sixty runtimes.
    externals: Box<[Declared]>,
    /// How many of `externals` are inputs.
    n_in: usize,
    /// The shapes of the last run, by index into `externals`, once one of them differs from
    /// its bound; empty (no allocation) while every shape is its bound, as in every run of a
    /// graph of static shapes.
    shapes: Box<[Shape]>,
    /// Staging buffers by input index, for inputs bound without slack: each made at the first
    /// such run, at its bound's size. Empty (no allocation) until one is needed: most
    /// runtimes never stage.
    staging: Box<[Option<AlignedBytes>]>,
    /// Handed to xnn_setup_runtime_v2: inputs then outputs, filled in place every run.
    bound: Box<[sys::xnn_external_value]>,
    reshape_pending: bool,
    workspace: Option<Arc<Workspace>>,
    _threadpool: Option<Arc<Threadpool>>,
    _borrows: PhantomData<&'a ()>,
}

// SAFETY: a runtime may be used from any thread, one at a time (running takes `&mut self`).
unsafe impl Send for Runtime<'_> {}

/// The inputs then the outputs, each sorted by external id, in a list of exactly their number
/// (collecting through a `Result` would round a list of two up to room for four).
fn externals(
    inputs: &[ExternalDecl],
    outputs: &[ExternalDecl],
) -> Result<Box<[Declared]>, XnnError> {
    let mut all = Vec::with_capacity(inputs.len() + outputs.len());
    for d in inputs.iter().chain(outputs) {
        let dtype = d
            .datatype
            .boundary_dtype()
            .ok_or(XnnError::UnsupportedExternal {
                id: d.id,
                datatype: d.datatype,
            })?;
        all.push(Declared {
            id: d.id,
            dtype,
            bound: d.shape,
            reshaped: d.reshaped,
        });
    }
    all[..inputs.len()].sort_by_key(|e| e.id);
    all[inputs.len()..].sort_by_key(|e| e.id);
    Ok(all.into_boxed_slice())
}

impl<'a> Runtime<'a> {
    /// Creates a runtime; with a weights cache, XNNPACK looks packed weights up there (and
    /// packs into it on a miss) instead of packing into private memory.
    pub fn new(
        subgraph: &Subgraph<'a>,
        weights_cache: Option<&'a dyn AsXnnWeightsCache>,
    ) -> Result<Runtime<'a>, XnnError> {
        Runtime::with_options(subgraph, weights_cache, &RuntimeOptions::default())
    }

    /// As [`new`](Self::new), on a shared workspace and a thread pool.
    pub fn with_options(
        subgraph: &Subgraph<'a>,
        weights_cache: Option<&'a dyn AsXnnWeightsCache>,
        options: &RuntimeOptions,
    ) -> Result<Runtime<'a>, XnnError> {
        let externals = externals(&subgraph.inputs, &subgraph.outputs)?;
        let cache = weights_cache.map_or(std::ptr::null_mut(), |c| c.as_xnn_weights_cache());
        let workspace = options
            .workspace
            .as_ref()
            .map_or(std::ptr::null_mut(), |w| w.as_raw());
        let threadpool = options
            .threadpool
            .as_ref()
            .map_or(std::ptr::null_mut(), |t| t.as_raw());
        let flags = if options.keep_node_order {
            XNN_FLAG_NO_OPERATOR_FUSION
        } else {
            0
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: the subgraph is valid; the cache, when given, outlives 'a (its trait
        // contract); the workspace and pool are held by the runtime (Arcs below) until it is
        // deleted; `raw` is a valid out-pointer.
        check("xnn_create_runtime_v4", unsafe {
            sys::xnn_create_runtime_v4(
                subgraph.as_raw(),
                cache,
                workspace,
                threadpool,
                flags,
                &mut raw,
            )
        })?;
        let raw = NonNull::new(raw).ok_or(XnnError::Call {
            call: "xnn_create_runtime_v4",
            status: super::Status::OutOfMemory,
        })?;
        let bound = externals
            .iter()
            .map(|e| sys::xnn_external_value {
                id: e.id,
                data: std::ptr::null_mut(),
            })
            .collect();
        Ok(Runtime {
            raw,
            n_in: subgraph.inputs.len(),
            externals,
            shapes: Box::default(),
            staging: Box::default(),
            bound,
            reshape_pending: true,
            workspace: options.workspace.clone(),
            _threadpool: options.threadpool.clone(),
            _borrows: PhantomData,
        })
    }

    /// The external inputs, by ascending id.
    pub fn inputs(&self) -> impl ExactSizeIterator<Item = External> + '_ {
        (0..self.n_in).map(|k| self.external(k))
    }

    /// The external outputs, by ascending id; shapes are those of the last run.
    pub fn outputs(&self) -> impl ExactSizeIterator<Item = External> + '_ {
        (self.n_in..self.externals.len()).map(|k| self.external(k))
    }

    /// External `k` (inputs then outputs) with its shape of the last run.
    fn external(&self, k: usize) -> External {
        let d = self.externals[k];
        External {
            id: d.id,
            dtype: d.dtype,
            bound: d.bound,
            shape: self.shapes.get(k).copied().unwrap_or(d.bound),
        }
    }

    /// Records external `k`'s shape of this run, making room for every shape the first time
    /// one is not its bound.
    fn set_shape(&mut self, k: usize, shape: Shape) {
        if self.shapes.is_empty() {
            if shape == self.externals[k].bound {
                return;
            }
            self.shapes = self.externals.iter().map(|d| d.bound).collect();
        }
        self.shapes[k] = shape;
    }

    /// The bytes of the workspace XNNPACK planned this runtime's intermediate tensors into
    /// (shared with other runtimes on the same workspace), once a run has planned it; `None`
    /// before that, or for an XNNPACK not built by `xnnpack-sys` (no internal headers to read it
    /// with).
    pub fn workspace_size(&self) -> Option<usize> {
        if !sys::HAS_KERNEL_INFO {
            return None;
        }
        // SAFETY: `raw` is a live runtime owned by `self`; the shim reads two fields of it and of
        // its workspace and keeps no pointer.
        let size = unsafe { sys::xnnblob_runtime_workspace_size(self.raw.as_ptr()) };
        (size > 0).then_some(size)
    }

    /// Runs the graph on one input and one output per external, in ascending id order. Each
    /// output's shape is set to what the run produced.
    pub fn execute(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), XnnError> {
        arity("inputs", self.n_in, inputs.len())?;
        arity("outputs", self.outputs().len(), outputs.len())?;
        // SAFETY: every pointer comes from a live borrow held for this call, with its length
        // (and slack only when the view promises it); output borrows are exclusive.
        unsafe {
            self.execute_raw(
                |i| RawInput::of(&inputs[i]),
                |j| RawOutput {
                    data: outputs[j].as_mut_ptr(),
                    capacity: outputs[j].capacity(),
                    dtype: outputs[j].dtype(),
                },
            )
        }?;
        for (e, out) in self.outputs().zip(outputs.iter_mut()) {
            out.set_shape(e.shape);
        }
        Ok(())
    }

    /// Runs the graph on buffers given by position (ascending external id).
    ///
    /// # Safety
    /// Every input must be readable for `len` bytes (plus XNN_EXTRA_BYTES when `padded`), every
    /// output writable for `capacity` bytes, for the duration of the call. An input and an
    /// output may share memory only if the graph, as XNNPACK runs it, reads the input
    /// completely before it writes that output: XNNPACK fuses a Copy or a Clamp into the node
    /// that computes its input, which then writes the output earlier, unless the runtime keeps
    /// the node order ([`RuntimeOptions::keep_node_order`]). A delegate checks this for the
    /// outputs it is told are bound over inputs
    /// ([`XnnDelegate::init_with_aliases`](crate::delegate::XnnDelegate::init_with_aliases)).
    pub unsafe fn execute_raw(
        &mut self,
        input: impl FnMut(usize) -> RawInput,
        mut output: impl FnMut(usize) -> RawOutput,
    ) -> Result<(), XnnError> {
        // SAFETY: forwarded contract.
        unsafe { self.execute_raw_shaped(input, |j, _| output(j)) }
    }

    /// As [`execute_raw`](Self::execute_raw), telling `output` each output's shape for this run
    /// (known once the inputs are bound), so a caller whose output buffers are sized by shape
    /// (ExecuTorch's `resize_tensor`) can size them first.
    ///
    /// # Safety
    /// As for [`execute_raw`](Self::execute_raw).
    pub unsafe fn execute_raw_shaped(
        &mut self,
        mut input: impl FnMut(usize) -> RawInput,
        mut output: impl FnMut(usize, &Shape) -> RawOutput,
    ) -> Result<(), XnnError> {
        // Background work of the caches waits while this runs (see `activity.rs`).
        let _inference = super::activity::Inference::begin();
        // A shared workspace is used by one runtime at a time, from reshape to the end of run.
        let workspace = self.workspace.clone();
        let _in_use = workspace.as_ref().map(|w| w.lock());
        let n_in = self.n_in;
        for i in 0..n_in {
            let given = input(i);
            let e = self.external(i);
            let needed = check_buffer("input", i, e.dtype, given.dtype, &given.shape, given.len)?;
            let shape = self.input_shape(i, given.shape)?;
            self.set_input_shape(i, shape)?;
            let data = if given.padded {
                given.data
            } else {
                if self.staging.is_empty() {
                    self.staging = (0..n_in).map(|_| None).collect();
                }
                let staging = match &mut self.staging[i] {
                    Some(s) => s,
                    none => {
                        let capacity = e
                            .bound
                            .nbytes(e.dtype)
                            .and_then(|n| n.checked_add(XNN_EXTRA_BYTES));
                        let made = capacity
                            .and_then(|n| AlignedBytes::zeroed(n, 64))
                            .ok_or(XnnError::OutOfMemory { bytes: capacity })?;
                        none.insert(made)
                    }
                };
                // SAFETY: the caller's contract makes `needed` (≤ len) bytes readable; the
                // staging buffer holds the bound's bytes, at least `needed` (shape checked).
                unsafe {
                    std::ptr::copy_nonoverlapping(given.data, staging.as_ptr(), needed);
                }
                staging.as_ptr().cast_const()
            };
            self.bound[i].data = data.cast_mut().cast();
        }
        self.reshape_if_pending()?;
        for j in 0..self.externals.len() - n_in {
            let e = self.external(n_in + j);
            let given = output(j, &e.shape);
            check_buffer("output", j, e.dtype, given.dtype, &e.shape, given.capacity)?;
            self.bound[n_in + j].data = given.data.cast();
        }
        // SAFETY: every external points to a buffer of the size its current shape needs (inputs
        // padded or staged), valid until this call returns (the caller's contract); the next
        // run binds them all again before running.
        check("xnn_setup_runtime_v2", unsafe {
            sys::xnn_setup_runtime_v2(self.raw.as_ptr(), self.bound.len(), self.bound.as_ptr())
        })?;
        // SAFETY: the runtime is set up with the buffers above, which are still valid.
        check("xnn_invoke_runtime", unsafe {
            sys::xnn_invoke_runtime(self.raw.as_ptr())
        })
    }

    /// Runs the graph on f32 buffers given by external id, each holding exactly the elements
    /// of its current shape (inputs may instead hold those of the declared one). A convenience
    /// for tests and small tools: it allocates; [`execute`](Self::execute) is the path that
    /// does not.
    pub fn invoke(
        &mut self,
        inputs: &[(u32, &[f32])],
        outputs: &mut [(u32, &mut [f32])],
    ) -> Result<(), XnnError> {
        let ids = |s: &[Declared]| s.iter().map(|e| e.id).collect::<Vec<_>>();
        let (ins, outs) = self.externals.split_at(self.n_in);
        bound_exactly_once(&ids(ins), inputs.iter().map(|(id, _)| *id))?;
        bound_exactly_once(&ids(outs), outputs.iter().map(|(id, _)| *id))?;
        let mut ins = Vec::new();
        for i in 0..self.n_in {
            let e = self.external(i);
            let data = inputs.iter().find(|(id, _)| *id == e.id).expect("bound").1;
            let shape = [e.shape, e.bound]
                .into_iter()
                .find(|s| s.numel() == Some(data.len()))
                .ok_or(XnnError::ExternalSize {
                    id: e.id,
                    expected_elements: e.shape.numel().unwrap_or(usize::MAX),
                    given_elements: data.len(),
                })?;
            self.set_input_shape(i, shape)?;
            ins.push(TensorRef::f32(shape, data));
        }
        self.prepare()?;
        let mut outs = Vec::new();
        for e in self.outputs() {
            let data = outputs
                .iter_mut()
                .find(|(id, _)| *id == e.id)
                .map(|(_, d)| &mut **d)
                .expect("bound");
            let expected = e.shape.numel().unwrap_or(usize::MAX);
            if data.len() != expected {
                return Err(XnnError::ExternalSize {
                    id: e.id,
                    expected_elements: expected,
                    given_elements: data.len(),
                });
            }
            // SAFETY: each output id is bound once (checked above), so these borrows of
            // distinct elements of `outputs` never alias.
            let data = unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr(), data.len()) };
            outs.push(TensorMut::f32(data));
        }
        self.execute(&ins, &mut outs)
    }

    /// The shape input `index` runs as when the caller gives `given`.
    fn input_shape(&self, index: usize, given: Shape) -> Result<Shape, XnnError> {
        let declared = &self.externals[index];
        let bound = declared.bound;
        // A tensor of another rank with the declared number of elements (ExecuTorch passes a
        // scalar where the graph declares [1]) is the declared tensor.
        if given.numel() == bound.numel() && (given.rank() != bound.rank() || declared.reshaped) {
            return Ok(bound);
        }
        if declared.reshaped {
            // XNNPACK reads it under a fixed shape of these elements: no other count is a run
            // the graph could make.
            return Err(XnnError::ReshapedInputSize {
                index,
                shapes: Box::new(ShapeMismatch { given, bound }),
            });
        }
        Ok(given)
    }

    /// Reshapes input `index` if `shape` differs from its current one.
    fn set_input_shape(&mut self, index: usize, shape: Shape) -> Result<(), XnnError> {
        let e = self.external(index);
        if !shape.fits_within(&e.bound) {
            return Err(XnnError::ShapeOutOfBounds {
                index,
                shapes: Box::new(ShapeMismatch {
                    given: shape,
                    bound: e.bound,
                }),
            });
        }
        if shape != e.shape {
            // SAFETY: the runtime is valid; `dims` holds `rank` dimensions.
            check("xnn_reshape_external_value", unsafe {
                sys::xnn_reshape_external_value(
                    self.raw.as_ptr(),
                    e.id,
                    shape.rank(),
                    shape.dims().as_ptr(),
                )
            })?;
            self.set_shape(index, shape);
            self.reshape_pending = true;
        }
        Ok(())
    }

    /// Reshapes the runtime if an input's shape changed since the last reshape, so output
    /// shapes are current.
    fn prepare(&mut self) -> Result<(), XnnError> {
        let workspace = self.workspace.clone();
        let _in_use = workspace.as_ref().map(|w| w.lock());
        self.reshape_if_pending()
    }

    /// As [`prepare`](Self::prepare), for a caller that holds the workspace.
    fn reshape_if_pending(&mut self) -> Result<(), XnnError> {
        if self.reshape_pending {
            // SAFETY: the runtime is valid.
            check("xnn_reshape_runtime", unsafe {
                sys::xnn_reshape_runtime(self.raw.as_ptr())
            })?;
            for k in self.n_in..self.externals.len() {
                let shape = query_shape(self.raw, self.externals[k].id)?;
                self.set_shape(k, shape);
            }
            self.reshape_pending = false;
        }
        Ok(())
    }

    /// The current shape of an external input or output.
    pub fn external_shape(&mut self, id: u32) -> Result<Vec<usize>, XnnError> {
        self.prepare()?;
        (0..self.externals.len())
            .find(|&k| self.externals[k].id == id)
            .map(|k| self.external(k).shape.dims().to_vec())
            .ok_or(XnnError::UnknownExternal { id })
    }
}

/// Checks a buffer of `dtype` and `len` bytes holds a tensor of `shape` as the graph's `expected`
/// dtype; returns the bytes that tensor takes.
fn check_buffer(
    what: &'static str,
    index: usize,
    expected: DType,
    dtype: DType,
    shape: &Shape,
    len: usize,
) -> Result<usize, XnnError> {
    if dtype != expected {
        return Err(XnnError::DtypeMismatch {
            what,
            index,
            expected,
            given: dtype,
        });
    }
    match shape.nbytes(expected) {
        Some(n) if n <= len => Ok(n),
        needed => Err(XnnError::BufferTooSmall {
            what,
            index,
            needed,
            given: len,
        }),
    }
}

fn arity(what: &'static str, expected: usize, given: usize) -> Result<(), XnnError> {
    if expected != given {
        return Err(XnnError::Arity {
            what,
            expected,
            given,
        });
    }
    Ok(())
}

impl RawInput {
    /// The binding of a tensor view (its bytes, and slack only when it promises it).
    pub fn of(t: &TensorRef<'_>) -> RawInput {
        RawInput {
            data: t.data().as_ptr(),
            len: t.data().len(),
            dtype: t.dtype(),
            shape: *t.shape(),
            padded: t.is_padded(),
        }
    }
}

fn query_shape(raw: NonNull<sys::xnn_runtime>, id: u32) -> Result<Shape, XnnError> {
    let mut dims = [0usize; sys::XNN_MAX_TENSOR_DIMS as usize];
    let mut rank = 0usize;
    // SAFETY: `dims` has room for XNN_MAX_TENSOR_DIMS entries, the most XNNPACK writes.
    check("xnn_get_external_value_shape", unsafe {
        sys::xnn_get_external_value_shape(raw.as_ptr(), id, &mut rank, dims.as_mut_ptr())
    })?;
    Ok(Shape::new(&dims[..rank.min(dims.len())]).unwrap_or_default())
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
