//! Stateful programs built by hand: mutable buffers (a KV cache, an encoder's cross-attention
//! state) shared by the methods of one program instance, over raw delegate payloads.
//!
//! ExecuTorch's own exports of such programs (`share_mutable_buffers=True`) are not read here:
//! [`crate::program::Program`] runs them, its methods sharing a
//! [`SharedState`](crate::program::SharedState) laid out as ExecuTorch plans it.
//!
//! - Buffers are declared once for the program ([`StateSpec`]) and laid out once over all of them
//!   ([`StateLayout`]: declaration order, 64-byte alignment, XNNPACK's over-read slack after
//!   each), so every method sees the same layout whichever is loaded first.
//! - Each instance owns its arena, one [`MemoryBank`] per bank id: memory the user may provide,
//!   written by the runtime only through the bank's copy function.
//! - Methods read state as external inputs bound in place to the arena, and write it back
//!   through explicit copy nodes into external outputs bound to the same place. A method's
//!   delegate is told which outputs share a read's memory
//!   ([`XnnDelegate::init_with_aliases`]): it refuses a method that writes a buffer before it
//!   has read it completely, and runs one whose write-back XNNPACK would fuse into the node that
//!   computes it, ahead of a later read, with the nodes in the method's order.
//! - Initial state: zeros (no bytes in any file), or a named-data key copied in at load and at
//!   every [`Instance::reset`].

use crate::aligned::AlignedBytes;
use crate::backend::ModelContext;
use crate::delegate::{Alias, DelegateError, XnnDelegate};
use crate::named_data::{DataBuffer, NamedDataError, NamedDataMap};
use crate::tensor::{DType, Shape};
use crate::xnn::{RawInput, RawOutput};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

const ALIGNMENT: usize = 64;
/// XNNPACK may read this many bytes past any buffer.
const SLACK: usize = 16;

/// How a buffer starts (and restarts at `reset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitialState {
    /// All zeros: stored as shape only.
    Zeros,
    /// The fp32 bytes of this named-data key.
    Named(String),
}

/// A declared mutable buffer (fp32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSpec {
    /// The name methods bind the buffer by, unique within the program.
    pub name: String,
    /// The buffer's shape, in fp32 elements.
    pub shape: Vec<usize>,
    /// The id of the memory bank the buffer lives in; ids count from 0, and are below the
    /// number of buffers declared (a bank for each at most).
    pub bank: usize,
    /// What the buffer holds after instantiation and after each [`Instance::reset`].
    pub initial: InitialState,
}

impl StateSpec {
    /// The number of elements; None when it overflows.
    pub fn elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// The bytes the buffer takes; None when that overflows.
    pub fn bytes(&self) -> Option<usize> {
        self.elements()?.checked_mul(4)
    }
}

/// Where each buffer lives: (bank, byte offset), and each bank's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLayout {
    /// (bank id, byte offset in that bank) of each buffer, in declaration order.
    pub offsets: Vec<(usize, usize)>,
    /// The bytes each bank must hold, by bank id, including XNNPACK's over-read slack.
    pub bank_sizes: Vec<usize>,
}

impl StateLayout {
    /// Plans all buffers at once, in declaration order: deterministic, and the same for every
    /// method whatever subset of the buffers it touches. None when a size overflows or a bank
    /// id is not below the number of buffers.
    pub fn plan(specs: &[StateSpec]) -> Option<StateLayout> {
        // A bank each is the most a program's buffers can use: a larger id is refused here,
        // where taken on trust it sized a table of banks (and the banks an instance is given).
        let banks = specs
            .iter()
            .map(|s| s.bank.checked_add(1).filter(|_| s.bank < specs.len()))
            .try_fold(0usize, |m, b| Some(m.max(b?)))?;
        let mut bank_sizes = vec![0usize; banks];
        let mut offsets = Vec::with_capacity(specs.len());
        for s in specs {
            let offset = bank_sizes[s.bank].checked_next_multiple_of(ALIGNMENT)?;
            bank_sizes[s.bank] = offset.checked_add(s.bytes()?)?.checked_add(SLACK)?;
            offsets.push((s.bank, offset));
        }
        Some(StateLayout {
            offsets,
            bank_sizes,
        })
    }
}

/// Memory that holds state. XNNPACK's operators read and write it in place; the runtime itself
/// writes it only through [`copy_in`](MemoryBank::copy_in) and reads it only through
/// [`copy_out`](MemoryBank::copy_out).
///
/// # Safety
/// `base` must point to at least `len` bytes, aligned to 64, valid for reads and writes and not
/// moving for as long as the bank lives; nothing else may access them while a method runs.
pub unsafe trait MemoryBank: Send {
    /// The bank's size in bytes.
    fn len(&self) -> usize;
    /// Whether the bank has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The start of the bank's memory, which XNNPACK reads and writes in place.
    fn base(&mut self) -> NonNull<u8>;
    /// The bank's copy function: `src` into the bank at `offset`.
    fn copy_in(&mut self, offset: usize, src: &[u8]);
    /// The bank's bytes at `offset` into `dst`.
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]);
    /// Called before XNNPACK's operators run on the bank (and `end_execute` after).
    fn begin_execute(&mut self) {}
    /// Called after XNNPACK's operators have run on the bank.
    fn end_execute(&mut self) {}
}

/// A bank in host memory with memcpy as its copy function (the default).
pub struct HostBank(AlignedBytes);

impl HostBank {
    /// A zeroed, 64-byte-aligned bank of `len` bytes; None if it cannot be allocated.
    pub fn new(len: usize) -> Option<HostBank> {
        AlignedBytes::zeroed(len, ALIGNMENT).map(HostBank)
    }
}

// SAFETY: the allocation is owned, 64-aligned, at least `len` bytes, and never moves.
unsafe impl MemoryBank for HostBank {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn base(&mut self) -> NonNull<u8> {
        NonNull::new(self.0.as_ptr()).expect("allocated")
    }
    fn copy_in(&mut self, offset: usize, src: &[u8]) {
        self.0.as_mut_slice()[offset..offset + src.len()].copy_from_slice(src);
    }
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.0[offset..offset + dst.len()]);
    }
}

/// Why a stateful program, instance or method could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A buffer's initial value could not be read from the named data.
    #[error(transparent)]
    NamedData(NamedDataError),
    /// A method's XNNPACK delegate failed to initialise or to run.
    #[error("method {method:?}")]
    Delegate {
        /// The method whose delegate failed.
        method: String,
        /// What the delegate reported.
        #[source]
        error: DelegateError,
    },
    /// A declaration, binding or bank that does not fit.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(m: impl Into<String>) -> StateError {
    StateError::Invalid(m.into())
}

/// A method of a stateful program: its payload and which of its externals are state.
#[derive(Debug, Clone)]
pub struct StatefulMethod {
    /// The name the method is loaded and executed by.
    pub name: String,
    /// The method's XNNPACK delegate payload (the processed `XH00` blob).
    pub payload: DataBuffer,
    /// (external id, state name): inputs bound to the buffer (reads).
    pub reads: Vec<(u32, String)>,
    /// (external id, state name): outputs bound to the buffer (write-backs).
    pub writes: Vec<(u32, String)>,
}

/// A program with shared mutable state: declarations, layout, methods, weights.
pub struct StatefulProgram {
    specs: Vec<StateSpec>,
    layout: StateLayout,
    methods: Vec<StatefulMethod>,
    map: Arc<dyn NamedDataMap>,
    model: ModelContext,
}

impl StatefulProgram {
    /// A program whose methods load their constants through `model`'s backend and find their
    /// packed weights in `model`'s cache (a file, for warm launches that pack nothing).
    pub fn new(
        model: &ModelContext,
        specs: Vec<StateSpec>,
        methods: Vec<StatefulMethod>,
        map: Arc<dyn NamedDataMap>,
    ) -> Result<StatefulProgram, StateError> {
        for (i, s) in specs.iter().enumerate() {
            if specs[..i].iter().any(|o| o.name == s.name) {
                return Err(invalid(format!("state {:?} declared twice", s.name)));
            }
            let bytes = s
                .bytes()
                .ok_or_else(|| invalid(format!("state {:?}: its size overflows", s.name)))?;
            if let InitialState::Named(key) = &s.initial {
                let size = map.data_size(key).map_err(StateError::NamedData)?;
                if size != bytes {
                    return Err(invalid(format!(
                        "state {:?}: initial value {key:?} has {size} bytes, the buffer {bytes}",
                        s.name
                    )));
                }
            }
        }
        for m in &methods {
            for (_, name) in m.reads.iter().chain(&m.writes) {
                if !specs.iter().any(|s| s.name == *name) {
                    return Err(invalid(format!(
                        "method {:?} binds unknown state {name:?}",
                        m.name
                    )));
                }
            }
        }
        let layout = StateLayout::plan(&specs)
            .ok_or_else(|| {
                invalid("the state layout's size overflows, or a bank id is not below the number of buffers")
            })?;
        Ok(StatefulProgram {
            specs,
            layout,
            methods,
            map,
            model: model.clone(),
        })
    }

    /// Where each buffer lives, and how large each bank must be.
    pub fn layout(&self) -> &StateLayout {
        &self.layout
    }

    /// An instance with its own arena in host memory.
    pub fn instantiate(self: &Arc<Self>) -> Result<Instance, StateError> {
        let banks = self
            .layout
            .bank_sizes
            .iter()
            .map(|&n| {
                HostBank::new(n.max(1))
                    .map(|b| Box::new(b) as Box<dyn MemoryBank>)
                    .ok_or_else(|| invalid("out of memory"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.instantiate_in(banks)
    }

    /// An instance whose arena lives in the given banks (one per bank id, large enough).
    pub fn instantiate_in(
        self: &Arc<Self>,
        banks: Vec<Box<dyn MemoryBank>>,
    ) -> Result<Instance, StateError> {
        if banks.len() != self.layout.bank_sizes.len() {
            return Err(invalid(format!(
                "{} banks given, the layout has {}",
                banks.len(),
                self.layout.bank_sizes.len()
            )));
        }
        for (i, (b, &need)) in banks.iter().zip(&self.layout.bank_sizes).enumerate() {
            if b.len() < need {
                return Err(invalid(format!(
                    "bank {i} holds {} bytes, the layout needs {need}",
                    b.len()
                )));
            }
        }
        let mut instance = Instance {
            program: self.clone(),
            banks,
            methods: HashMap::new(),
        };
        instance.reset()?;
        Ok(instance)
    }
}

/// One instance of a stateful program: its own state, shared by its methods.
pub struct Instance {
    program: Arc<StatefulProgram>,
    banks: Vec<Box<dyn MemoryBank>>,
    methods: HashMap<String, XnnDelegate>,
}

impl Instance {
    /// Re-applies every buffer's initial state, through each bank's copy function.
    pub fn reset(&mut self) -> Result<(), StateError> {
        let p = self.program.clone();
        for (spec, &(bank, offset)) in p.specs.iter().zip(&p.layout.offsets) {
            let bytes = match &spec.initial {
                InitialState::Zeros => vec![0u8; spec.bytes().expect("checked at new")],
                InitialState::Named(key) => {
                    p.map.get_data(key).map_err(StateError::NamedData)?.to_vec()
                }
            };
            self.banks[bank].copy_in(offset, &bytes);
        }
        Ok(())
    }

    /// Loads a method (once) into this instance.
    pub fn load(&mut self, name: &str) -> Result<(), StateError> {
        if self.methods.contains_key(name) {
            return Ok(());
        }
        let p = &self.program;
        let m = p
            .methods
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| invalid(format!("no method {name:?}")))?;
        // A buffer's write-back is bound over its read: the delegate makes sure it is written
        // after the last read, as XNNPACK runs the graph.
        let mut aliases = Vec::new();
        for (output, written) in &m.writes {
            for (input, read) in &m.reads {
                if read == written {
                    aliases.push(Alias {
                        input: *input,
                        output: *output,
                    });
                }
            }
        }
        let d = XnnDelegate::init_with_aliases(&p.model, m.payload.clone(), &*p.map, &aliases)
            .map_err(|error| StateError::Delegate {
                method: name.to_string(),
                error,
            })?;
        self.methods.insert(name.to_string(), d);
        Ok(())
    }

    /// Runs a method: `inputs` are its non-state inputs in external-id order; returns its
    /// non-state outputs. State is read and written in place.
    pub fn execute(&mut self, name: &str, inputs: &[&[f32]]) -> Result<Vec<Vec<f32>>, StateError> {
        self.load(name)?;
        let p = self.program.clone();
        let m = p.methods.iter().find(|m| m.name == name).expect("loaded");
        let d = self.methods.get_mut(name).expect("loaded");
        // Each external is bound to a state buffer (its address and bytes) or to the caller's.
        let mut bind = |id: u32, shape: &Shape, list: &[(u32, String)]| {
            let Some((_, state)) = list.iter().find(|(e, _)| *e == id) else {
                return Ok(None);
            };
            let i = p
                .specs
                .iter()
                .position(|s| s.name == *state)
                .expect("validated");
            let bytes = p.specs[i].bytes().expect("checked at new");
            if shape.nbytes(DType::F32) != Some(bytes) {
                return Err(invalid(format!(
                    "{name}: external {id} has shape {shape}, state {state:?} {:?}",
                    p.specs[i].shape
                )));
            }
            let (bank, offset) = p.layout.offsets[i];
            // The offset lies inside the bank (checked against the layout at instantiation).
            let ptr = self.banks[bank].base().as_ptr().wrapping_add(offset);
            Ok(Some((ptr, bytes)))
        };
        let mut input_bindings = Vec::new();
        let mut next = inputs.iter();
        for e in d.inputs() {
            match bind(e.id, &e.bound, &m.reads)? {
                Some((ptr, len)) => input_bindings.push((ptr.cast_const(), len, e.bound, true)),
                None => {
                    let data = next
                        .next()
                        .ok_or_else(|| invalid(format!("{name}: too few inputs")))?;
                    input_bindings.push((data.as_ptr().cast(), data.len() * 4, e.bound, false));
                }
            }
        }
        if next.next().is_some() {
            return Err(invalid(format!("{name}: too many inputs")));
        }
        let mut user_outputs: Vec<Vec<f32>> = Vec::new();
        let mut output_bindings = Vec::new();
        for e in d.outputs() {
            match bind(e.id, &e.shape, &m.writes)? {
                Some((ptr, len)) => output_bindings.push((ptr, len, None)),
                None => {
                    let elements = e.shape.numel().unwrap_or(0);
                    output_bindings.push((
                        std::ptr::null_mut(),
                        elements * 4,
                        Some(user_outputs.len()),
                    ));
                    user_outputs.push(vec![0.0; elements]);
                }
            }
        }
        for (ptr, _, user) in &mut output_bindings {
            if let Some(k) = user {
                *ptr = user_outputs[*k].as_mut_ptr().cast();
            }
        }
        for b in self.banks.iter_mut() {
            b.begin_execute();
        }
        // SAFETY: state pointers are bank memory laid out for their buffer (bytes plus the
        // layout's slack, inside the bank, checked at instantiation), which MemoryBank's
        // contract keeps valid; `&mut self` keeps anything else off the banks while XNNPACK
        // runs. User inputs and outputs are live slices of the stated lengths. A read and a
        // write-back of one buffer share the address: the delegate was made knowing it, and
        // checked that the graph, as XNNPACK runs it, writes the buffer after its last read.
        let result = unsafe {
            d.execute_raw(
                |i| {
                    let (data, len, shape, padded) = input_bindings[i];
                    RawInput {
                        data,
                        len,
                        dtype: DType::F32,
                        shape,
                        padded,
                    }
                },
                |j| RawOutput {
                    data: output_bindings[j].0,
                    capacity: output_bindings[j].1,
                    dtype: DType::F32,
                },
            )
        };
        for b in self.banks.iter_mut() {
            b.end_execute();
        }
        result.map_err(|error| StateError::Delegate {
            method: name.to_string(),
            error,
        })?;
        Ok(user_outputs)
    }

    /// A buffer's current value, read through its bank's copy function.
    pub fn read_state(&mut self, name: &str) -> Result<Vec<f32>, StateError> {
        let p = &self.program;
        let i = p
            .specs
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| invalid(format!("no state {name:?}")))?;
        let (bank, offset) = p.layout.offsets[i];
        let mut bytes = vec![0u8; p.specs[i].bytes().expect("checked at new")];
        self.banks[bank].copy_out(offset, &mut bytes);
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }
}
