//! An initialised method of a [`Program`](super::Program): a buffer for every value it produces,
//! its delegates bound to them, and the execute that runs its steps in place.

use super::{
    InputError, MethodPlan, ProgramError, SharedState, Step, ValueBytes, ValueSpec, broadcast,
    plan_error, specs_of,
};
use crate::delegate::XnnDelegate;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::tensor::{DType, PaddedTensor, Shape, ShapeMismatch, TensorRef};
use crate::xnn::{RawInput, RawOutput};

/// Where a value's current data is during an execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The caller's input `k`.
    Input(usize),
    /// The method's own buffer.
    Buffer,
    /// The shared state's arena, at this offset, in the value's declared shape.
    Shared(usize),
    /// Never written before it is read: rejected at init.
    Unset,
}

/// An initialised method.
pub struct Method {
    plan: MethodPlan,
    delegates: Vec<XnnDelegate>,
    /// A buffer for every value a step writes, every constant, every mutable buffer not shared,
    /// and every output.
    buffers: Vec<Option<PaddedTensor>>,
    /// Where each value is read from.
    sources: Vec<Source>,
    /// The state shared with the program's other methods, when this one plans values in it.
    shared: Option<SharedState>,
}

/// Puts each delegate call's arguments in the order its delegate binds them (inputs, then
/// outputs, by ascending external id): the argument at each external's id, as ExecuTorch's
/// backend binds `args[id]`. A call passes every input of the graph it was lowered from, so an
/// input the delegate never reads has no external and its argument is left out.
fn bind_delegate_arguments(
    mut plan: MethodPlan,
    delegates: &[XnnDelegate],
) -> Result<MethodPlan, ProgramError> {
    for step in &mut plan.steps {
        let Step::Delegate { index, args } = step else {
            continue;
        };
        let d = &delegates[*index];
        let bound = d
            .inputs()
            .chain(d.outputs())
            .map(|e| {
                args.get(e.id as usize).copied().ok_or_else(|| {
                    plan_error(
                        &plan.name,
                        format!(
                            "delegate {index} binds argument {}, the call passes {}",
                            e.id,
                            args.len()
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        *args = bound;
    }
    Ok(plan)
}

/// A value's bytes for one step: where they start, and the shape they have.
struct Located {
    data: *const u8,
    shape: Shape,
}

impl Method {
    /// Checks the plan against the delegates (arity, dtypes, values written before read) and
    /// makes every buffer. `shared` is the state the method shares with the program's others:
    /// its mutable buffers there take their initial values now, as in ExecuTorch's runtime.
    pub(super) fn new(
        plan: MethodPlan,
        delegates: Vec<XnnDelegate>,
        named: &dyn NamedDataMap,
        shared: &SharedState,
    ) -> Result<Method, ProgramError> {
        let plan = bind_delegate_arguments(plan, &delegates)?;
        let name = plan.name.clone();
        let n = plan.values.len();
        let mut sources = vec![Source::Unset; n];
        let mut buffers: Vec<Option<PaddedTensor>> = (0..n).map(|_| None).collect();
        let spec_of = |v: usize| {
            plan.values[v].ok_or_else(|| {
                plan_error(
                    &name,
                    format!("value {v} is not a tensor of a supported dtype"),
                )
            })
        };
        let make = |buffers: &mut Vec<Option<PaddedTensor>>, v: usize| {
            if buffers[v].is_some() {
                return Ok(());
            }
            let spec = spec_of(v)?;
            let t = PaddedTensor::zeros(spec.dtype, spec.bound)
                .map_err(|e| plan_error(&name, format!("value {v}: {e}")))?;
            buffers[v] = Some(t);
            Ok::<(), ProgramError>(())
        };
        // The bytes of a constant or initial value, exactly as many as the value's shape holds.
        let bytes_of = |v: usize, bytes: &ValueBytes| -> Result<DataBuffer, ProgramError> {
            let data = match bytes {
                ValueBytes::Here(b) => b.clone(),
                ValueBytes::Named(key) => named.get_data(key)?,
            };
            let spec = spec_of(v)?;
            let needed = spec.bound.nbytes(spec.dtype);
            if needed != Some(data.len()) {
                return Err(plan_error(
                    &name,
                    format!(
                        "value {v} has {} bytes, its shape {} of {} needs {needed:?}",
                        data.len(),
                        spec.bound,
                        spec.dtype
                    ),
                ));
            }
            Ok(data)
        };
        specs_of(&plan, &plan.inputs)?;
        for (k, &v) in plan.inputs.iter().enumerate() {
            sources[v] = Source::Input(k);
        }
        for (v, data) in &plan.constants {
            let data = bytes_of(*v, data)?;
            make(&mut buffers, *v)?;
            let t = buffers[*v].as_mut().expect("made");
            t.data_mut().copy_from_slice(data.data());
            sources[*v] = Source::Buffer;
        }
        for &(v, offset) in &plan.shared {
            let spec = spec_of(v)?;
            let end = spec
                .bound
                .nbytes(spec.dtype)
                .and_then(|b| offset.checked_add(b));
            if end.is_none_or(|end| end > shared.len()) {
                return Err(plan_error(
                    &name,
                    format!(
                        "value {v} lies outside the shared state ({} bytes): a state made for \
                         another program?",
                        shared.len()
                    ),
                ));
            }
            sources[v] = Source::Shared(offset);
        }
        // A write-back's target is state, whether or not the program names it: it may be read
        // before this execute writes it.
        let written_back = plan.steps.iter().filter_map(|s| match s {
            Step::Copy { dst, .. } => Some(*dst),
            _ => None,
        });
        let mutable: Vec<(usize, Option<&ValueBytes>)> = plan
            .mutable
            .iter()
            .map(|m| (m.value, m.initial.as_ref()))
            .chain(written_back.map(|v| (v, None)))
            .collect();
        for (v, initial) in mutable {
            if let Source::Input(_) = sources[v] {
                return Err(plan_error(
                    &name,
                    format!("value {v} is an input and a mutable buffer"),
                ));
            }
            let data = initial.map(|i| bytes_of(v, i)).transpose()?;
            match (sources[v], data) {
                (Source::Shared(offset), Some(data)) => {
                    let mut arena = shared.lock();
                    arena.as_mut_slice()[offset..offset + data.len()].copy_from_slice(data.data());
                }
                (Source::Shared(_), None) => {}
                (_, data) => {
                    make(&mut buffers, v)?;
                    if let Some(data) = data {
                        let t = buffers[v].as_mut().expect("made");
                        t.data_mut().copy_from_slice(data.data());
                    }
                    sources[v] = Source::Buffer;
                }
            }
        }
        // Shared values are read and written in the arena, in their declared shapes; steps
        // that would give one another shape are refused.
        let not_shared = |sources: &[Source], v: usize, what: &str| match sources[v] {
            Source::Shared(_) => Err(plan_error(
                &name,
                format!(
                    "{what} value {v}, which is in the shared state (only aten::copy_ writes there)"
                ),
            )),
            _ => Ok(()),
        };
        for step in &plan.steps {
            match step {
                Step::Delegate { index, args } => {
                    let d = &delegates[*index];
                    let n_in = d.inputs().len();
                    let externals = d.inputs().chain(d.outputs());
                    for (position, (&a, e)) in args.iter().zip(externals).enumerate() {
                        let spec = plan.values[a].ok_or_else(|| {
                            plan_error(&name, format!("delegate argument {a} is not a tensor"))
                        })?;
                        if spec.dtype != e.dtype {
                            return Err(plan_error(
                                &name,
                                format!(
                                    "delegate {index} argument {position} (value {a}) is {}, \
                                     the delegate takes {}",
                                    spec.dtype, e.dtype
                                ),
                            ));
                        }
                        if position < n_in {
                            if sources[a] == Source::Unset {
                                return Err(plan_error(
                                    &name,
                                    format!("value {a} is read before it is written"),
                                ));
                            }
                        } else {
                            if args[..n_in].contains(&a) || matches!(sources[a], Source::Input(_)) {
                                return Err(plan_error(
                                    &name,
                                    format!(
                                        "delegate {index} writes value {a}, which it reads or the caller gives"
                                    ),
                                ));
                            }
                            not_shared(&sources, a, &format!("delegate {index} writes"))?;
                            make(&mut buffers, a)?;
                            sources[a] = Source::Buffer;
                        }
                    }
                }
                &Step::Move { from, to } | &Step::Copy { src: from, dst: to } => {
                    let what = if matches!(step, Step::Move { .. }) {
                        "moved"
                    } else {
                        "copied"
                    };
                    if sources[from] == Source::Unset {
                        return Err(plan_error(
                            &name,
                            format!("value {from} is {what} before it is written"),
                        ));
                    }
                    let (f, t) = (spec_of(from)?, spec_of(to)?);
                    if f.dtype != t.dtype {
                        return Err(plan_error(
                            &name,
                            format!("value {from} {what} to value {to} changes the dtype"),
                        ));
                    }
                    if let Step::Copy { .. } = step {
                        // Its shape at each execute is checked then; its bound must fit now.
                        broadcast::check(&f.bound, &t.bound).map_err(|e| {
                            plan_error(&name, format!("copy_ of value {from} into {to}: {e}"))
                        })?;
                    } else {
                        not_shared(&sources, to, "a move writes")?;
                    }
                    if let Source::Input(_) = sources[to] {
                        return Err(plan_error(
                            &name,
                            format!("value {to} is given by the caller and written by the method"),
                        ));
                    }
                    if !matches!(sources[to], Source::Shared(_)) {
                        make(&mut buffers, to)?;
                        sources[to] = Source::Buffer;
                    }
                }
                Step::Expand { src, dst, sizes } => {
                    let (src, dst) = (*src, *dst);
                    if sources[src] == Source::Unset {
                        return Err(plan_error(
                            &name,
                            format!("value {src} is expanded before it is written"),
                        ));
                    }
                    let (f, t) = (spec_of(src)?, spec_of(dst)?);
                    let to = broadcast::expanded(&f.bound, sizes).filter(|to| {
                        broadcast::check(&f.bound, to).is_ok() && to.fits_within(&t.bound)
                    });
                    if f.dtype != t.dtype || to.is_none() {
                        return Err(plan_error(
                            &name,
                            format!(
                                "expand_copy of value {src} ({} {}) to {sizes:?} does not fit \
                                 value {dst} ({} {})",
                                f.dtype, f.bound, t.dtype, t.bound
                            ),
                        ));
                    }
                    not_shared(&sources, dst, "expand_copy writes")?;
                    if let Source::Input(_) = sources[dst] {
                        return Err(plan_error(
                            &name,
                            format!("value {dst} is given by the caller and written by the method"),
                        ));
                    }
                    make(&mut buffers, dst)?;
                    sources[dst] = Source::Buffer;
                }
            }
        }
        specs_of(&plan, &plan.outputs)?;
        for &o in &plan.outputs {
            match sources[o] {
                Source::Unset => {
                    return Err(plan_error(
                        &name,
                        format!("output value {o} is never written"),
                    ));
                }
                // An input, or a shared value (which the next method may change), returned as
                // an output: copied into a buffer at each execute.
                Source::Input(_) | Source::Shared(_) => make(&mut buffers, o)?,
                Source::Buffer => {}
            }
        }
        let shared = (!plan.shared.is_empty()).then(|| shared.clone());
        Ok(Method {
            plan,
            delegates,
            buffers,
            sources,
            shared,
        })
    }

    /// The method's name in the program.
    pub fn name(&self) -> &str {
        &self.plan.name
    }

    /// The declared specs of the inputs.
    pub fn input_specs(&self) -> Vec<ValueSpec> {
        specs_of(&self.plan, &self.plan.inputs).unwrap_or_default()
    }

    /// The declared spec of input `index` (no allocation).
    pub fn input_spec(&self, index: usize) -> Option<ValueSpec> {
        self.plan.values[*self.plan.inputs.get(index)?]
    }

    /// The declared (largest) shapes of the inputs.
    pub fn input_shapes(&self) -> Vec<Vec<usize>> {
        self.input_specs()
            .iter()
            .map(|s| s.bound.dims().to_vec())
            .collect()
    }

    /// The number of outputs.
    pub fn num_outputs(&self) -> usize {
        self.plan.outputs.len()
    }

    /// The delegates' init timings, in delegate order.
    pub fn delegates(&self) -> &[XnnDelegate] {
        &self.delegates
    }

    fn bad_input(&self, error: InputError) -> ProgramError {
        ProgramError::BadInput {
            method: self.plan.name.clone(),
            error,
        }
    }

    /// Runs the method. Inputs are checked against their dtype and bound; padded ones are bound
    /// to the delegates in place, others copied once. Outputs are read afterwards with
    /// [`output`](Self::output), in place. Nothing is allocated once warm.
    pub fn execute(&mut self, inputs: &[TensorRef<'_>]) -> Result<(), ProgramError> {
        if inputs.len() != self.plan.inputs.len() {
            return Err(self.bad_input(InputError::Count {
                expected: self.plan.inputs.len(),
                given: inputs.len(),
            }));
        }
        for (index, (t, &v)) in inputs.iter().zip(&self.plan.inputs).enumerate() {
            let spec = self.plan.values[v].expect("checked at init");
            if t.dtype() != spec.dtype {
                return Err(self.bad_input(InputError::Dtype {
                    index,
                    expected: spec.dtype,
                    given: t.dtype(),
                }));
            }
            let fits = if spec.dynamic {
                t.shape().fits_within(&spec.bound)
            } else {
                *t.shape() == spec.bound
            };
            if !fits {
                return Err(self.bad_input(InputError::Shape {
                    index,
                    shapes: Box::new(ShapeMismatch {
                        given: *t.shape(),
                        bound: spec.bound,
                    }),
                    dynamic: spec.dynamic,
                }));
            }
            let needed = t.shape().nbytes(spec.dtype);
            if needed.is_none_or(|n| n > t.data().len()) {
                return Err(self.bad_input(InputError::Bytes {
                    index,
                    needed,
                    given: t.data().len(),
                }));
            }
        }
        // Methods sharing state run one at a time: the arena is this execute's until it ends.
        let shared = self.shared.clone();
        let mut arena = shared.as_ref().map(|s| s.lock());
        let base = arena
            .as_mut()
            .map_or(std::ptr::null_mut(), |a| a.as_mut_slice().as_mut_ptr());
        for s in 0..self.plan.steps.len() {
            match &self.plan.steps[s] {
                Step::Delegate { index, args } => {
                    let (index, n_in) = (*index, self.delegates[*index].inputs().len());
                    let buffers = self.buffers.as_mut_ptr();
                    let (sources, values) = (&self.sources, &self.plan.values);
                    let input = |i: usize| {
                        let a = args[i];
                        match sources[a] {
                            Source::Input(k) => RawInput::of(&inputs[k]),
                            Source::Shared(offset) => {
                                let spec = values[a].expect("checked at init");
                                RawInput {
                                    // SAFETY: `offset` plus the value's bytes lie inside the
                                    // arena, which XNNPACK's slack follows (checked at init);
                                    // the arena is locked for this execute.
                                    data: unsafe { base.add(offset) },
                                    len: spec.bound.nbytes(spec.dtype).unwrap_or(0),
                                    dtype: spec.dtype,
                                    shape: spec.bound,
                                    padded: true,
                                }
                            }
                            // SAFETY: `a` < buffers.len() (a value index) and holds a buffer
                            // (a written value, checked at init); no output of this call is
                            // `a` (checked at init), so no mutable access aliases it.
                            _ => RawInput::of(
                                &unsafe { &*buffers.add(a) }
                                    .as_ref()
                                    .expect("made at init")
                                    .as_ref(),
                            ),
                        }
                    };
                    let output = |j: usize| {
                        let a = args[n_in + j];
                        // SAFETY: as above; output arguments are distinct buffers (never in the
                        // shared arena, checked at init), not read by this call, so this is the
                        // only access to `a` during it.
                        let t = unsafe { &mut *buffers.add(a) }
                            .as_mut()
                            .expect("made at init");
                        RawOutput {
                            data: t.as_mut_ptr(),
                            capacity: t.capacity(),
                            dtype: t.dtype(),
                        }
                    };
                    // SAFETY: inputs are the caller's borrowed views (with their own lengths and
                    // slack), this method's buffers or the locked arena; outputs are buffers
                    // with their capacities; all outlive the call, and no output aliases an
                    // input.
                    unsafe { self.delegates[index].execute_raw(input, output) }.map_err(
                        |error| ProgramError::Delegate {
                            method: self.plan.name.clone(),
                            error,
                        },
                    )?;
                    for (j, e) in self.delegates[index].outputs().enumerate() {
                        let a = args[n_in + j];
                        let t = self.buffers[a].as_mut().expect("made at init");
                        // The runtime checked the output fits the buffer's capacity.
                        let fits = t.set_shape(e.shape);
                        debug_assert!(fits, "output shape {} beyond capacity", e.shape);
                    }
                }
                &Step::Move { from, to } => {
                    let from = self.locate(from, inputs, base);
                    self.write(to, &from, from.shape, base)?
                }
                &Step::Copy { src, dst } => {
                    let from = self.locate(src, inputs, base);
                    let to = self.locate(dst, inputs, base).shape;
                    self.write(dst, &from, to, base)?
                }
                Step::Expand { src, dst, sizes } => {
                    let (dst, from) = (*dst, self.locate(*src, inputs, base));
                    let to = broadcast::expanded(&from.shape, sizes).ok_or_else(|| {
                        plan_error(
                            &self.plan.name,
                            format!("expand_copy of {} to {sizes:?}", from.shape),
                        )
                    })?;
                    self.write(dst, &from, to, base)?
                }
            }
        }
        for i in 0..self.plan.outputs.len() {
            let o = self.plan.outputs[i];
            if let Source::Input(_) | Source::Shared(_) = self.sources[o] {
                let from = self.locate(o, inputs, base);
                let t = self.buffers[o].as_mut().expect("made at init");
                if t.set_shape(from.shape) {
                    let n = t.data().len();
                    // SAFETY: the source holds its shape's bytes (an input checked above, or
                    // the locked arena, checked at init); the buffer is another allocation.
                    unsafe { std::ptr::copy_nonoverlapping(from.data, t.as_mut_ptr(), n) };
                }
            }
        }
        drop(arena);
        Ok(())
    }

    /// Where value `v` is for this execute, and its shape now. `base` is the locked arena's
    /// start (null when the method shares nothing).
    fn locate(&self, v: usize, inputs: &[TensorRef<'_>], base: *mut u8) -> Located {
        match self.sources[v] {
            Source::Input(k) => Located {
                data: inputs[k].data().as_ptr(),
                shape: *inputs[k].shape(),
            },
            Source::Shared(offset) => Located {
                // SAFETY: inside the arena (checked at init), which `base` starts.
                data: unsafe { base.add(offset) }.cast_const(),
                shape: self.plan.values[v].expect("checked at init").bound,
            },
            Source::Buffer | Source::Unset => {
                let t = self.buffers[v].as_ref().expect("made at init");
                Located {
                    data: t.data().as_ptr(),
                    shape: *t.shape(),
                }
            }
        }
    }

    /// Writes `from` into value `to` in shape `shape`: the same bytes when the shapes agree
    /// (a move, or a write-back), else broadcast.
    fn write(
        &mut self,
        to: usize,
        from: &Located,
        shape: Shape,
        base: *mut u8,
    ) -> Result<(), ProgramError> {
        let spec = self.plan.values[to].expect("checked at init");
        let unfit = |why: String| plan_error(&self.plan.name, format!("writing value {to}: {why}"));
        let dst = match self.sources[to] {
            Source::Shared(offset) => {
                if shape != spec.bound {
                    return Err(unfit(format!(
                        "shape {shape}, in the shared state {}",
                        spec.bound
                    )));
                }
                // SAFETY: inside the arena (checked at init), which `base` starts.
                unsafe { base.add(offset) }
            }
            _ => {
                let t = self.buffers[to].as_mut().expect("made at init");
                if t.as_mut_ptr().cast_const() == from.data {
                    // A value moved onto itself, or a buffer written back to itself.
                    return Ok(());
                }
                if !t.set_shape(shape) {
                    return Err(unfit(format!(
                        "shape {shape} is beyond its bound {}",
                        spec.bound
                    )));
                }
                t.as_mut_ptr()
            }
        };
        let bytes = |s: &Shape| s.nbytes(spec.dtype).unwrap_or(0);
        let (n_src, n_dst) = (bytes(&from.shape), bytes(&shape));
        if from.shape == shape {
            // SAFETY: both hold the shape's bytes (inputs checked in execute, buffers and the
            // arena by construction); they may overlap in the arena, so this is a memmove.
            unsafe { std::ptr::copy(from.data, dst, n_dst) };
            return Ok(());
        }
        broadcast::check(&from.shape, &shape).map_err(|e| unfit(e.to_string()))?;
        let (s, d) = (from.data as usize, dst as usize);
        if s < d + n_dst && d < s + n_src {
            return Err(unfit("its source overlaps it in the shared state".into()));
        }
        // SAFETY: as above, and the two ranges do not overlap (just checked).
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(from.data, n_src),
                std::slice::from_raw_parts_mut(dst, n_dst),
            )
        };
        broadcast::copy(src, &from.shape, dst, &shape, spec.dtype.size());
        Ok(())
    }

    /// Output `index` of the last execute, in place: dtype, actual shape, bytes.
    pub fn output(&self, index: usize) -> Result<TensorRef<'_>, ProgramError> {
        let v = *self.plan.outputs.get(index).ok_or_else(|| {
            self.bad_input(InputError::NoSuchOutput {
                index,
                outputs: self.plan.outputs.len(),
            })
        })?;
        Ok(self.buffers[v].as_ref().expect("made at init").as_ref())
    }

    /// A convenience for fp32 methods: inputs of the declared shapes (or, for an input whose
    /// leading dimension is dynamic, of as many rows as the data holds); returns each output's
    /// values. It allocates; [`execute`](Self::execute) does not.
    pub fn execute_f32(&mut self, inputs: &[&[f32]]) -> Result<Vec<Vec<f32>>, ProgramError> {
        let specs = self.input_specs();
        let mut views = Vec::with_capacity(inputs.len());
        for (data, spec) in inputs
            .iter()
            .zip(specs.iter().chain(std::iter::repeat(&ValueSpec {
                dtype: DType::F32,
                bound: Shape::default(),
                dynamic: false,
            })))
        {
            views.push(TensorRef::f32(rows_for(spec, data.len()), data));
        }
        self.execute(&views)?;
        (0..self.num_outputs())
            .map(|i| {
                let t = self.output(i)?;
                Ok(crate::tensor::to_f32_lossy(t.dtype(), t.data()))
            })
            .collect()
    }
}

/// The shape of `elements` values for an input of `spec`: the bound, or with a dynamic leading
/// dimension, as many rows as the values fill.
pub fn rows_for(spec: &ValueSpec, elements: usize) -> Shape {
    let bound = spec.bound;
    if spec.dynamic && bound.rank() > 0 && bound.numel() != Some(elements) {
        let row: usize = bound.dims()[1..].iter().product();
        if row > 0 && elements.is_multiple_of(row) {
            let mut dims = bound.dims().to_vec();
            dims[0] = elements / row;
            if let Ok(shape) = Shape::new(&dims) {
                return shape;
            }
        }
    }
    bound
}
