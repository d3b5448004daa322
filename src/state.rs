//! Stateful programs: mutable buffers (a KV cache, an encoder's cross-attention state) shared by
//! the methods of one program instance.
//!
//! - Buffers are declared once for the program ([`StateSpec`]) and laid out once over all of them
//!   ([`StateLayout`]: declaration order, 64-byte alignment, XNNPACK's over-read slack after
//!   each), so every method sees the same layout whichever is loaded first.
//! - Each instance owns its arena, one [`MemoryBank`] per bank id: memory the user may provide,
//!   written by the runtime only through the bank's copy function.
//! - Methods read state as external inputs bound in place to the arena, and write it back
//!   through explicit copy nodes into external outputs bound to the same place.
//! - Initial state: zeros (no bytes in any file), or a named-data key copied in at load and at
//!   every [`Instance::reset`].

use crate::aligned::AlignedBytes;
use crate::cache::PackedWeightsCache;
use crate::delegate::{DelegateError, XnnDelegate};
use crate::named_data::{DataBuffer, NamedDataError, NamedDataMap};
use crate::shared_cache::SharedDataCache;
use std::collections::HashMap;
use std::fmt;
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
    pub name: String,
    pub shape: Vec<usize>,
    pub bank: usize,
    pub initial: InitialState,
}

impl StateSpec {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Where each buffer lives: (bank, byte offset), and each bank's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLayout {
    pub offsets: Vec<(usize, usize)>,
    pub bank_sizes: Vec<usize>,
}

impl StateLayout {
    /// Plans all buffers at once, in declaration order: deterministic, and the same for every
    /// method whatever subset of the buffers it touches.
    pub fn plan(specs: &[StateSpec]) -> StateLayout {
        let banks = specs.iter().map(|s| s.bank + 1).max().unwrap_or(0);
        let mut bank_sizes = vec![0usize; banks];
        let offsets = specs
            .iter()
            .map(|s| {
                let offset = bank_sizes[s.bank].next_multiple_of(ALIGNMENT);
                bank_sizes[s.bank] = offset + s.elements() * 4 + SLACK;
                (s.bank, offset)
            })
            .collect();
        StateLayout {
            offsets,
            bank_sizes,
        }
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
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn base(&mut self) -> NonNull<u8>;
    /// The bank's copy function: `src` into the bank at `offset`.
    fn copy_in(&mut self, offset: usize, src: &[u8]);
    /// The bank's bytes at `offset` into `dst`.
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]);
    /// Called before XNNPACK's operators run on the bank (and `end_execute` after).
    fn begin_execute(&mut self) {}
    fn end_execute(&mut self) {}
}

/// A bank in host memory with memcpy as its copy function (the default).
pub struct HostBank(AlignedBytes);

impl HostBank {
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

#[derive(Debug)]
pub enum StateError {
    NamedData(NamedDataError),
    Delegate {
        method: String,
        error: DelegateError,
    },
    /// A declaration, binding or bank that does not fit.
    Invalid(String),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::NamedData(e) => write!(f, "{e}"),
            StateError::Delegate { method, error } => write!(f, "method {method:?}: {error}"),
            StateError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StateError {}

fn invalid(m: impl Into<String>) -> StateError {
    StateError::Invalid(m.into())
}

/// A method of a stateful program: its payload and which of its externals are state.
#[derive(Debug, Clone)]
pub struct StatefulMethod {
    pub name: String,
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
    shared: SharedDataCache,
    weights: Arc<PackedWeightsCache>,
}

impl StatefulProgram {
    pub fn new(
        specs: Vec<StateSpec>,
        methods: Vec<StatefulMethod>,
        map: Arc<dyn NamedDataMap>,
    ) -> Result<StatefulProgram, StateError> {
        for (i, s) in specs.iter().enumerate() {
            if specs[..i].iter().any(|o| o.name == s.name) {
                return Err(invalid(format!("state {:?} declared twice", s.name)));
            }
            if let InitialState::Named(key) = &s.initial {
                let size = map.data_size(key).map_err(StateError::NamedData)?;
                if size != s.elements() * 4 {
                    return Err(invalid(format!(
                        "state {:?}: initial value {key:?} has {size} bytes, the buffer {}",
                        s.name,
                        s.elements() * 4
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
        let layout = StateLayout::plan(&specs);
        Ok(StatefulProgram {
            specs,
            layout,
            methods,
            map,
            shared: SharedDataCache::new(),
            weights: PackedWeightsCache::in_memory(),
        })
    }

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
                InitialState::Zeros => vec![0u8; spec.elements() * 4],
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
        let d = XnnDelegate::init(
            m.payload.clone(),
            &*p.map,
            &p.shared,
            Some(p.weights.clone()),
        )
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
        let (ins, outs) = d.externals();
        let state_of = |id: u32, list: &[(u32, String)]| {
            list.iter().find(|(e, _)| *e == id).map(|(_, n)| n.clone())
        };
        let mut in_place = Vec::new();
        let mut user_inputs = Vec::new();
        let mut next = inputs.iter();
        for (id, shape) in ins {
            match state_of(*id, &m.reads) {
                Some(state) => in_place.push((*id, state, shape.iter().product::<usize>())),
                None => user_inputs.push((
                    *id,
                    *next
                        .next()
                        .ok_or_else(|| invalid(format!("{name}: too few inputs")))?,
                )),
            }
        }
        if next.next().is_some() {
            return Err(invalid(format!("{name}: too many inputs")));
        }
        let mut user_outputs: Vec<(u32, Vec<f32>)> = Vec::new();
        for (id, shape) in outs {
            match state_of(*id, &m.writes) {
                Some(state) => in_place.push((*id, state, shape.iter().product::<usize>())),
                None => user_outputs.push((*id, vec![0.0; shape.iter().product()])),
            }
        }
        let mut bound = Vec::new();
        for (id, state, elements) in &in_place {
            let i = p
                .specs
                .iter()
                .position(|s| s.name == *state)
                .expect("validated");
            if p.specs[i].elements() != *elements {
                return Err(invalid(format!(
                    "{name}: external {id} has {elements} elements, state {state:?} {}",
                    p.specs[i].elements()
                )));
            }
            let (bank, offset) = p.layout.offsets[i];
            let base = self.banks[bank].base();
            // The offset lies inside the bank (checked against the layout at instantiation).
            let ptr =
                NonNull::new(base.as_ptr().wrapping_add(offset).cast::<f32>()).expect("non-null");
            bound.push((*id, ptr, *elements));
        }
        let mut out_refs: Vec<(u32, &mut [f32])> = user_outputs
            .iter_mut()
            .map(|(id, v)| (*id, v.as_mut_slice()))
            .collect();
        for b in self.banks.iter_mut() {
            b.begin_execute();
        }
        // SAFETY: each pointer is bank memory laid out for this buffer: elements * 4 bytes plus
        // the layout's slack, inside the bank (checked at instantiation), which MemoryBank's
        // contract keeps valid; `&mut self` keeps anything else off the banks while XNNPACK
        // runs. A read and a write-back of one buffer share the address: the write-back is the
        // graph's last node (an explicit copy), after every read.
        let result = unsafe { d.execute_in_place(&user_inputs, &mut out_refs, &bound) };
        for b in self.banks.iter_mut() {
            b.end_execute();
        }
        result.map_err(|error| StateError::Delegate {
            method: name.to_string(),
            error,
        })?;
        Ok(user_outputs.into_iter().map(|(_, v)| v).collect())
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
        let mut bytes = vec![0u8; p.specs[i].elements() * 4];
        self.banks[bank].copy_out(offset, &mut bytes);
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }
}
