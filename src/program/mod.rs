//! Whole ExecuTorch programs (`.pte` + external `.ptd` files) whose methods are fully delegated
//! to XNNPACK: each method's delegate calls run through [`XnnDelegate`], with the program's
//! named data merged with the external files, loaded through the [`Backend`] so that weights
//! two methods, or two programs, share are loaded and packed once.
//!
//! A [`Method`] holds a buffer for every value it produces, sized for the value's declared
//! bound, made once at init: an execute binds the caller's inputs and these buffers to the
//! delegates in place, reshapes only when a shape changed, and allocates nothing.
//!
//! Programs that keep state run too (issue 43). A mutable buffer lives as long as its method
//! (a KV cache between calls), or, planned in the memory the methods share
//! ([`SHARED_MEMORY_ID`]), as long as the [`SharedState`] the methods were made with. Outside
//! the delegates a method may run only the two operators such programs add: `aten::copy_`,
//! the write-back of a mutable buffer, and `aten::expand_copy.out` (`broadcast`).

mod broadcast;
mod pack_ahead;
mod shared_state;

pub use pack_ahead::{pack_ahead, PackedAhead};
pub use shared_state::{SharedState, SHARED_MEMORY_ID};

use crate::backend::{Backend, BackendError, ModelContext, PackedCache};
use crate::cache::PackedWeightsCache;
use crate::delegate::{DelegateError, XnnDelegate};
use crate::named_data::{
    pte_format, DataBuffer, FileDataMap, FormatError, MergedMap, NamedDataError, NamedDataMap,
};
use crate::schema::pte as fb;
use crate::shared_data::SharedDataCache;
use crate::tensor::{DType, PaddedTensor, Shape, ShapeMismatch, TensorRef, TooManyDims};
use crate::xnn::{RawInput, RawOutput};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Why a program or method could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// A named-data file or map (the program's own, or external) could not be opened or read.
    #[error(transparent)]
    NamedData(#[from] NamedDataError),
    /// The program's flatbuffer failed validation.
    #[error("{path}: not a valid program")]
    Format {
        /// The path of the `.pte` file.
        path: String,
        /// The check the program's header or flatbuffer failed.
        #[source]
        error: FormatError,
    },
    /// An XNNPACK delegate of the method failed to initialise or to run.
    #[error("method {method:?}")]
    Delegate {
        /// The method whose delegate failed.
        method: String,
        /// What the delegate reported.
        #[source]
        error: DelegateError,
    },
    /// The backend could not give the program its packed-weight cache or workspace.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The program has no method of this name.
    #[error("no method {name:?}; the program has {available:?}")]
    NoSuchMethod {
        /// The method name asked for.
        name: String,
        /// The names of the program's methods, in file order.
        available: Vec<String>,
    },
    /// The method runs an operator outside a delegate (or a non-XNNPACK delegate).
    #[error("method {method:?} is not fully delegated to XNNPACK: it runs {operator}{hint}")]
    NotDelegated {
        /// The method's name.
        method: String,
        /// What it runs, as a phrase: `the operator aten::add.out`, `operator #3` (an index the
        /// plan does not list) or `a delegate of backend "..."`.
        operator: String,
        /// Where to run it instead, when that is known (empty, or a sentence led by "; ").
        hint: &'static str,
    },
    /// The plan is malformed or uses what this runner does not support.
    #[error("method {method:?}: {reason}")]
    BadPlan {
        /// The method's name.
        method: String,
        /// What is malformed or unsupported, in words.
        reason: String,
    },
    /// The program's packed-weight cache failed (saving what [`pack_ahead()`] packed).
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    /// `execute` with inputs that do not fit the method.
    #[error("method {method:?}: inputs that do not fit")]
    BadInput {
        /// The method that was executed or read.
        method: String,
        /// How the inputs (or the output index) do not fit.
        #[source]
        error: InputError,
    },
}

/// How an input does not fit its method.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The wrong number of inputs.
    #[error("{given} inputs given, the method takes {expected}")]
    Count {
        /// The number of inputs the method takes.
        expected: usize,
        /// The number of inputs given.
        given: usize,
    },
    /// Input `index` has another dtype than the method's.
    #[error("input {index} is {given}, the method takes {expected}")]
    Dtype {
        /// The input's position among the method's inputs.
        index: usize,
        /// The dtype the method declares for the input.
        expected: DType,
        /// The dtype of the tensor given.
        given: DType,
    },
    /// Input `index` has a shape outside the declared bound (or, for a static input, other
    /// than the declared shape).
    #[error(fmt = input_shape)]
    Shape {
        /// The input's position among the method's inputs.
        index: usize,
        /// The shape given and the method's declared shape (the bound, for a dynamic input).
        shapes: Box<ShapeMismatch>,
        /// Whether the input is dynamic (any shape within the bound) rather than static.
        dynamic: bool,
    },
    /// Input `index` holds fewer bytes than its shape needs (None: that size overflows).
    #[error(fmt = input_bytes)]
    Bytes {
        /// The input's position among the method's inputs.
        index: usize,
        /// The bytes the input's shape needs; None when that size overflows.
        needed: Option<usize>,
        /// The bytes the input holds.
        given: usize,
    },
    /// Output `index` was asked for but the method has fewer.
    #[error("no output {index}: the method has {outputs}")]
    NoSuchOutput {
        /// The output index asked for.
        index: usize,
        /// The number of outputs the method has.
        outputs: usize,
    },
}

// The two messages below depend on a field's value (dynamic or static, size known or not),
// which a format string cannot branch on.

fn input_shape(
    index: &usize,
    shapes: &ShapeMismatch,
    dynamic: &bool,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    if *dynamic {
        write!(
            f,
            "input {index} has shape {}, outside the method's bound {} \
             (each dimension at most the bound's)",
            shapes.given, shapes.bound
        )
    } else {
        write!(
            f,
            "input {index} has shape {}; the method's input is static, of shape {}",
            shapes.given, shapes.bound
        )
    }
}

fn input_bytes(
    index: &usize,
    needed: &Option<usize>,
    given: &usize,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    crate::xnn::buffer_too_small(&"input", index, needed, given, f)
}

/// ExecuTorch's `TensorShapeDynamism::STATIC`.
const STATIC: i8 = 0;

/// A tensor value as the plan declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueSpec {
    /// The element type.
    pub dtype: DType,
    /// The declared sizes: the shape of a static tensor, the upper bound of a dynamic one.
    pub bound: Shape,
    /// Whether the shape may change between executes (within the bound).
    pub dynamic: bool,
}

/// One step of a method.
#[derive(Debug, Clone)]
enum Step {
    /// Run delegate `index` with these value indices as inputs, then outputs. As read, the
    /// call's arguments; once the method is made, the delegate's externals' (see
    /// [`bind_delegate_arguments`]).
    Delegate {
        index: usize,
        args: Vec<usize>,
    },
    Move {
        from: usize,
        to: usize,
    },
    /// `aten::copy_`: `src` broadcast into `dst`, in place (a mutable buffer's write-back).
    Copy {
        src: usize,
        dst: usize,
    },
    /// `aten::expand_copy.out`: `src` broadcast to `sizes` (-1 keeps a dimension) into `dst`.
    Expand {
        src: usize,
        dst: usize,
        sizes: Vec<i64>,
    },
}

/// A mutable buffer a method plans: state kept between its executes, or between methods when
/// planned in the shared memory.
#[derive(Debug, Clone)]
struct MutableBuffer {
    value: usize,
    /// What it holds when the method is made (None: zeros).
    initial: Option<ValueBytes>,
}

/// Where the bytes of a constant, or of a mutable buffer's initial value, are.
#[derive(Debug, Clone)]
enum ValueBytes {
    /// In the program.
    Here(DataBuffer),
    /// Under this key of the named data (a `.ptd`, for tensors ExecuTorch marks external).
    Named(String),
}

#[derive(Debug, Clone)]
struct MethodPlan {
    name: String,
    /// Every tensor value (None for non-tensors, or tensors of a dtype no delegate takes).
    values: Vec<Option<ValueSpec>>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    steps: Vec<Step>,
    /// The processed payload of each delegate.
    payloads: Vec<DataBuffer>,
    /// Constant tensors of the plan, viewed in the program's constant segment or named.
    constants: Vec<(usize, ValueBytes)>,
    /// The plan's mutable buffers.
    mutable: Vec<MutableBuffer>,
    /// Values planned in the shared memory, and their offsets in it.
    shared: Vec<(usize, usize)>,
}

/// The XNNPACK delegate payloads of every method of a `.pte`, by method name, in file order
/// (for `xnnblob inspect`: nothing is loaded or built).
pub fn delegate_payloads(
    pte: &FileDataMap,
) -> Result<Vec<(String, Vec<DataBuffer>)>, ProgramError> {
    let names: Vec<String> = program_of(pte)?
        .execution_plan()
        .iter()
        .flatten()
        .map(|p| p.name().unwrap_or("").to_string())
        .collect();
    names
        .into_iter()
        .map(|name| {
            let program = program_of(pte)?;
            let plan = program
                .execution_plan()
                .iter()
                .flatten()
                .find(|p| p.name().unwrap_or("") == name)
                .ok_or_else(|| plan_error(&name, "vanished"))?;
            let delegates: Vec<fb::BackendDelegate<'_>> = plan
                .delegates()
                .iter()
                .flatten()
                .filter(|d| d.id() == Some("XnnpackBackend"))
                .collect();
            let payloads = plan_payloads(pte, &program, &delegates, &name)?;
            Ok((name, payloads))
        })
        .collect()
}

/// A delegate constant that is all zeros and exactly the size of a mutable buffer that the
/// program's methods share: most likely that buffer, frozen into the delegate at export.
/// ExecuTorch 1.5.1's XNNPACK partitioner takes a buffer a method only reads as a matrix
/// product's weight for a constant, and keeps its export-time value (zeros, as mutable buffers
/// are exported), so that method never sees what another method writes (issue 43; docs/executorch.md
/// gives the export recipe that avoids it). A genuine weight of zeros of that very size is told
/// apart by nothing in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenBufferSuspect {
    /// The method whose delegate holds the constant.
    pub method: String,
    /// Which of its XNNPACK delegates.
    pub delegate: usize,
    /// The constant's named key: the sha256 of its bytes, all zero.
    pub key: String,
    /// Its length in bytes.
    pub bytes: usize,
    /// The shared mutable buffer of that size: `value N of METHOD`, for each method that plans
    /// one (memory id 2, where `share_mutable_buffers` puts them).
    pub buffers: Vec<String>,
}

/// The warning a face gives of the suspect, as one sentence naming the method, the constant,
/// the buffer and the export recipe (`xnnblob inspect` and `xnnblob run` print it on stderr
/// after `xnnblob: warning: `).
impl fmt::Display for FrozenBufferSuspect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "method {:?}, XNNPACK delegate {}: constant {} is {} bytes of zeros, the size of the \
             shared mutable buffer {}: ExecuTorch's partitioner likely froze that buffer into \
             this delegate at export, and this method will not see what the others write to it. \
             Export with the method writing the buffer back where it reads it \
             (docs/executorch.md, \"Methods that share state\")",
            self.method,
            self.delegate,
            self.key,
            self.bytes,
            self.buffers.join(" or ")
        )
    }
}

/// The delegate constants of `pte` that look like frozen shared buffers (see
/// [`FrozenBufferSuspect`]): read from the plans and the payloads' constant tables, with one
/// sha256 of zeros per size of a constant in the program's named data that some shared buffer
/// has; nothing is loaded. Constants kept in a `.ptd` are not looked at.
pub fn frozen_buffer_suspects(pte: &FileDataMap) -> Result<Vec<FrozenBufferSuspect>, ProgramError> {
    let program = program_of(pte)?;
    let mut buffers: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
    for plan in program.execution_plan().iter().flatten() {
        let method = plan.name().unwrap_or("");
        for (v, value) in plan.values().iter().flatten().enumerate() {
            let Some(t) = value.val_as_tensor() else {
                continue;
            };
            if t.allocation_info().map(|a| a.memory_id()) != Some(SHARED_MEMORY_ID) {
                continue;
            }
            if let Some(bytes) = value_spec(method, v, &t)?.and_then(|s| s.bound.nbytes(s.dtype)) {
                buffers
                    .entry(bytes)
                    .or_default()
                    .push(format!("value {v} of {method}"));
            }
        }
    }
    if buffers.is_empty() {
        return Ok(Vec::new());
    }
    // The sha256 of `n` zero bytes, hashed in chunks: `n` is the size of a constant the file
    // holds, never a size a plan merely claims.
    let zeros_key = |n: usize| {
        use sha2::Digest;
        let chunk = [0u8; 1 << 16];
        let mut hasher = crate::sha256::Sha256::new();
        let mut left = n;
        while left > 0 {
            let take = left.min(chunk.len());
            hasher.update(&chunk[..take]);
            left -= take;
        }
        crate::sha256::to_hex(&crate::sha256::finish(hasher))
    };
    let mut zero_keys: std::collections::HashMap<usize, String> = Default::default();
    let mut suspects = Vec::new();
    for (method, payloads) in delegate_payloads(pte)? {
        for (delegate, payload) in payloads.iter().enumerate() {
            let keys = crate::delegate::constant_keys(payload).map_err(|error| {
                ProgramError::Delegate {
                    method: method.clone(),
                    error,
                }
            })?;
            for key in keys {
                // Constants in the program's own named data (a `.ptd`'s are not seen here), of
                // the size of a shared buffer.
                let Some(bytes) = pte.data_size(&key).ok().filter(|n| buffers.contains_key(n))
                else {
                    continue;
                };
                let zeros = zero_keys.entry(bytes).or_insert_with(|| zeros_key(bytes));
                if *zeros == key {
                    suspects.push(FrozenBufferSuspect {
                        method: method.clone(),
                        delegate,
                        key,
                        bytes,
                        buffers: buffers[&bytes].clone(),
                    });
                }
            }
        }
    }
    Ok(suspects)
}

/// A loaded program: its named data merged with external data, and the model context (packed
/// weights, workspace) its methods share.
pub struct Program {
    source: String,
    pte: Arc<FileDataMap>,
    method_names: Vec<String>,
    map: MergedMap,
    model: ModelContext,
    /// The shared mutable buffers of the methods from `method`.
    state: SharedState,
    /// Delegate constants that look like shared buffers frozen at export: looked for the first
    /// time they are asked for.
    frozen: std::sync::OnceLock<Vec<FrozenBufferSuspect>>,
}

/// The bytes `plan` (of method `method`) plans in the shared memory: 0 when it plans none.
fn shared_memory_bytes(plan: &fb::ExecutionPlan<'_>, method: &str) -> Result<usize, ProgramError> {
    let Some(b) = plan
        .non_const_buffer_sizes()
        .and_then(|v| v.iter().nth(SHARED_MEMORY_ID as usize))
    else {
        return Ok(0);
    };
    usize::try_from(b).map_err(|_| plan_error(method, format!("shared memory of {b} bytes")))
}

/// A zeroed arena for the shared memory of `pte`'s methods: the largest any plans.
fn shared_state_of(pte: &FileDataMap) -> Result<SharedState, ProgramError> {
    let (mut len, mut largest) = (0usize, String::new());
    for plan in program_of(pte)?.execution_plan().iter().flatten() {
        let method = plan.name().unwrap_or("");
        let b = shared_memory_bytes(&plan, method)?;
        if b > len {
            (len, largest) = (b, method.to_string());
        }
    }
    SharedState::zeroed(len).ok_or_else(|| {
        plan_error(
            &largest,
            format!("{len} bytes of shared memory cannot be allocated"),
        )
    })
}

fn plan_error(method: &str, reason: impl Into<String>) -> ProgramError {
    ProgramError::BadPlan {
        method: method.to_string(),
        reason: reason.into(),
    }
}

fn index(method: &str, i: i32, len: usize, what: &str) -> Result<usize, ProgramError> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| plan_error(method, format!("{what} {i} out of range ({len})")))
}

/// The program flatbuffer of a mapped `.pte` (verified).
fn program_of(pte: &FileDataMap) -> Result<fb::Program<'_>, ProgramError> {
    let bytes = pte.file_bytes();
    let header = pte_format::parse_header(bytes).map_err(|error| ProgramError::Format {
        path: pte.name().to_string(),
        error,
    })?;
    let end = header
        .map_or(bytes.len(), |h| h.program_size as usize)
        .min(bytes.len());
    let opts = crate::named_data::bytes::verifier_options();
    flatbuffers::root_with_opts::<fb::Program>(&opts, &bytes[..end]).map_err(|e| {
        ProgramError::Format {
            path: pte.name().to_string(),
            error: FormatError::Verifier(e.to_string()),
        }
    })
}

/// The declared spec of a tensor value.
fn value_spec(
    method: &str,
    v: usize,
    t: &fb::Tensor<'_>,
) -> Result<Option<ValueSpec>, ProgramError> {
    let Some(dtype) = DType::from_scalar_type(t.scalar_type()) else {
        return Ok(None);
    };
    let dims: Vec<usize> = t
        .sizes()
        .map(|s| s.iter().map(|d| d.max(0) as usize).collect())
        .unwrap_or_default();
    let bound = Shape::new(&dims).map_err(|TooManyDims { rank }| {
        plan_error(method, format!("value {v} has {rank} dimensions"))
    })?;
    if bound.nbytes(dtype).is_none() {
        return Err(plan_error(method, format!("value {v}: its size overflows")));
    }
    Ok(Some(ValueSpec {
        dtype,
        bound,
        dynamic: t.shape_dynamism() != STATIC,
    }))
}

/// The payload of each of a plan's delegates: inline in the program or in a segment, viewed
/// in the mapped file.
fn plan_payloads(
    pte: &FileDataMap,
    program: &fb::Program<'_>,
    delegates: &[fb::BackendDelegate<'_>],
    name: &str,
) -> Result<Vec<DataBuffer>, ProgramError> {
    let file = pte.file_buffer();
    let bytes = file.data();
    let inline: Vec<&[u8]> = program
        .backend_delegate_data()
        .iter()
        .flatten()
        .map(|d| d.data().map(|v| v.bytes()).unwrap_or(&[]))
        .collect();
    let mut payloads = Vec::new();
    for (i, d) in delegates.iter().enumerate() {
        let r = d
            .processed()
            .ok_or_else(|| plan_error(name, format!("delegate {i} has no payload reference")))?;
        let payload = match r.location() {
            0 => {
                let data = inline.get(r.index() as usize).ok_or_else(|| {
                    plan_error(name, format!("inline payload {} does not exist", r.index()))
                })?;
                // The bytes are inside the mapped file: view them there, zero-copy. An entry
                // without data is an empty slice from elsewhere (found by fuzzing: the offset
                // overflowed), refused below as out of range.
                (data.as_ptr() as usize)
                    .checked_sub(bytes.as_ptr() as usize)
                    .and_then(|offset| file.slice(offset, data.len()))
            }
            1 => pte
                .segments()
                .get(r.index() as usize)
                .and_then(|&(offset, size)| file.slice(offset, size)),
            other => {
                return Err(plan_error(
                    name,
                    format!("unknown payload location {other}"),
                ))
            }
        }
        .ok_or_else(|| plan_error(name, format!("delegate {i}: payload out of range")))?;
        payloads.push(payload);
    }
    Ok(payloads)
}

/// The execution plan of method `name` (NoSuchMethod names no others: the caller knows them).
fn execution_plan<'a>(
    program: &fb::Program<'a>,
    name: &str,
) -> Result<fb::ExecutionPlan<'a>, ProgramError> {
    program
        .execution_plan()
        .iter()
        .flatten()
        .find(|p| p.name().unwrap_or("") == name)
        .ok_or_else(|| ProgramError::NoSuchMethod {
            name: name.to_string(),
            available: Vec::new(),
        })
}

/// The payloads of a method's XNNPACK delegates, whatever else the method runs.
fn xnnpack_payloads(pte: &FileDataMap, name: &str) -> Result<Vec<DataBuffer>, ProgramError> {
    let program = program_of(pte)?;
    let plan = execution_plan(&program, name)?;
    let delegates: Vec<fb::BackendDelegate<'_>> = plan
        .delegates()
        .iter()
        .flatten()
        .filter(|d| d.id() == Some("XnnpackBackend"))
        .collect();
    plan_payloads(pte, &program, &delegates, name)
}

/// Refuses a tensor laid out in other than its default dim order: this executor binds and
/// copies tensors in their default layout only, where ExecuTorch's runtime, with xnnblob's
/// backend, runs the others (a channels-last input, say).
fn in_default_dim_order(method: &str, v: usize, t: &fb::Tensor<'_>) -> Result<(), ProgramError> {
    let Some(order) = t.dim_order() else {
        return Ok(());
    };
    if order.iter().enumerate().all(|(d, o)| usize::from(o) == d) {
        return Ok(());
    }
    let order: Vec<u8> = order.iter().collect();
    Err(plan_error(
        method,
        format!(
            "value {v} is laid out in dim order {order:?}; this executor takes tensors in \
             their default dim order only (ExecuTorch's runtime with xnnblob's backend runs \
             such programs)"
        ),
    ))
}

/// Reads one execution plan.
fn read_plan(pte: &FileDataMap, name: &str) -> Result<MethodPlan, ProgramError> {
    let program = program_of(pte)?;
    let file = pte.file_buffer();
    let plan = execution_plan(&program, name)?;
    let values: Vec<fb::EValue<'_>> = plan.values().iter().flatten().collect();
    let n = values.len();
    let mut specs = Vec::with_capacity(n);
    for (v, value) in values.iter().enumerate() {
        specs.push(match value.val_as_tensor() {
            Some(t) => {
                in_default_dim_order(name, v, &t)?;
                value_spec(name, v, &t)?
            }
            None => None,
        });
    }
    let ids = |list: Option<flatbuffers::Vector<'_, i32>>,
               what: &str|
     -> Result<Vec<usize>, ProgramError> {
        list.iter()
            .flatten()
            .map(|i| index(name, i, n, what))
            .collect()
    };
    let inputs = ids(plan.inputs(), "input value")?;
    let outputs = ids(plan.outputs(), "output value")?;
    // (name, overload) of each operator.
    let operators: Vec<(&str, &str)> = plan
        .operators()
        .iter()
        .flatten()
        .map(|o| (o.name().unwrap_or("?"), o.overload().unwrap_or("")))
        .collect();
    let delegates: Vec<fb::BackendDelegate<'_>> = plan.delegates().iter().flatten().collect();
    let chains: Vec<fb::Chain<'_>> = plan.chains().iter().flatten().collect();
    let hint = if shared_memory_bytes(&plan, name)? > 0 {
        NOT_DELEGATED_SHARED_HINT
    } else {
        NOT_DELEGATED_HINT
    };
    if chains.len() > 1 {
        return Err(plan_error(
            name,
            format!("{} chains (one is supported)", chains.len()),
        ));
    }
    // The integers of an IntList value, whose items are the indices of Int values.
    let int_list = |v: usize| -> Result<Vec<i64>, ProgramError> {
        let list = values[v]
            .val_as_int_list()
            .ok_or_else(|| plan_error(name, format!("value {v} is not a list of integers")))?;
        list.items()
            .iter()
            .flatten()
            .map(|i| {
                let i = usize::try_from(i)
                    .ok()
                    .filter(|&i| i < n)
                    .ok_or_else(|| plan_error(name, format!("value {v}: item {i} out of range")))?;
                values[i].val_as_int().map(|x| x.int_val()).ok_or_else(|| {
                    plan_error(name, format!("value {v}: item {i} is not an integer"))
                })
            })
            .collect()
    };
    let mut steps = Vec::new();
    for instruction in chains
        .iter()
        .flat_map(|c| c.instructions().into_iter().flatten())
    {
        if let Some(k) = instruction.instr_args_as_kernel_call() {
            let operator = usize::try_from(k.op_index())
                .ok()
                .and_then(|i| operators.get(i).copied());
            let args = ids(k.args(), "kernel argument")?;
            // The out-variants' signatures: copy_(self, src, non_blocking) -> self, and
            // expand_copy.out(self, size, implicit, out) -> out; the result is the last argument.
            match operator {
                Some(("aten::copy_", "")) if args.len() == 4 && args[3] == args[0] => {
                    steps.push(Step::Copy {
                        src: args[1],
                        dst: args[0],
                    })
                }
                Some(("aten::expand_copy", "out")) if args.len() == 5 && args[4] == args[3] => {
                    steps.push(Step::Expand {
                        src: args[0],
                        dst: args[3],
                        sizes: int_list(args[1])?,
                    })
                }
                _ => {
                    return Err(ProgramError::NotDelegated {
                        method: name.to_string(),
                        operator: match operator {
                            Some((op, "")) => format!("the operator {op}"),
                            Some((op, overload)) => format!("the operator {op}.{overload}"),
                            None => format!("operator #{}", k.op_index()),
                        },
                        hint,
                    })
                }
            }
        } else if let Some(d) = instruction.instr_args_as_delegate_call() {
            let i = index(name, d.delegate_index(), delegates.len(), "delegate")?;
            let id = delegates[i].id().unwrap_or("");
            if id != "XnnpackBackend" {
                return Err(ProgramError::NotDelegated {
                    method: name.to_string(),
                    operator: format!("a delegate of backend {id:?}"),
                    hint,
                });
            }
            steps.push(Step::Delegate {
                index: i,
                args: ids(d.args(), "delegate argument")?,
            });
        } else if let Some(m) = instruction.instr_args_as_move_call() {
            steps.push(Step::Move {
                from: index(name, m.move_from(), n, "move source")?,
                to: index(name, m.move_to(), n, "move target")?,
            });
        } else if instruction.instr_args_as_free_call().is_some() {
            // Frees a value's memory early; buffers here live as long as the method.
        } else {
            return Err(plan_error(name, "control flow (jump) is not supported"));
        }
    }
    let payloads = plan_payloads(pte, &program, &delegates, name)?;
    // Bytes `size` long at entry `idx` of a subsegment table (the constant segment, or the
    // segment of mutable buffers' initial values), viewed in the file.
    let subsegment = |table: Option<fb::SubsegmentOffsets<'_>>,
                      idx: u32,
                      size: usize,
                      what: &str|
     -> Result<DataBuffer, ProgramError> {
        let outside = || plan_error(name, format!("{what} lies outside its segment"));
        let table = table.ok_or_else(|| plan_error(name, format!("{what}: no segment")))?;
        let offset = table
            .offsets()
            .filter(|o| (idx as usize) < o.len())
            .map(|o| o.get(idx as usize))
            .ok_or_else(|| plan_error(name, format!("{what}: no offset")))?;
        let &(seg_offset, seg_size) = pte
            .segments()
            .get(table.segment_index() as usize)
            .ok_or_else(|| plan_error(name, format!("{what}: segment out of range")))?;
        let offset = usize::try_from(offset).map_err(|_| outside())?;
        if offset.checked_add(size).is_none_or(|end| end > seg_size) {
            return Err(outside());
        }
        let at = seg_offset.checked_add(offset).ok_or_else(outside)?;
        file.slice(at, size).ok_or_else(outside)
    };
    let shared_len = shared_memory_bytes(&plan, name)?;
    let mut constants = Vec::new();
    let mut mutable = Vec::new();
    let mut shared = Vec::new();
    for (v, value) in values.iter().enumerate() {
        let Some(t) = value.val_as_tensor() else {
            continue;
        };
        let extra = t.extra_tensor_info();
        let fqn = extra.and_then(|e| e.fully_qualified_name());
        let external = extra.is_some_and(|e| e.location() == fb::TensorDataLocation::EXTERNAL);
        let external_key = || {
            fqn.map(|k| ValueBytes::Named(k.to_string()))
                .ok_or_else(|| plan_error(name, format!("value {v} is external but has no name")))
        };
        let spec = specs[v];
        let size = || {
            spec.and_then(|s| s.bound.nbytes(s.dtype)).ok_or_else(|| {
                plan_error(
                    name,
                    format!("value {v} has scalar type {}", t.scalar_type()),
                )
            })
        };
        match t.allocation_info() {
            // A constant: in the program's constant segment, or external.
            None if external => constants.push((v, external_key()?)),
            None if t.data_buffer_idx() != 0 => {
                let what = format!("constant value {v}");
                let bytes = subsegment(
                    program.constant_segment(),
                    t.data_buffer_idx(),
                    size()?,
                    &what,
                )?;
                constants.push((v, ValueBytes::Here(bytes)));
            }
            None => {}
            // Planned memory; a mutable buffer when named or given an initial value, which is
            // external, or in the first table of mutable data (where ExecuTorch's runtime
            // reads it, whatever the tensor names).
            Some(a) => {
                // Of a dtype no delegate takes: no step here can touch it (one that did would
                // be refused at init), so it needs no place.
                let Ok(bytes) = size() else {
                    continue;
                };
                let initial = if external {
                    Some(external_key()?)
                } else if t.data_buffer_idx() != 0 {
                    let what = format!("initial value of value {v}");
                    let table = program
                        .mutable_data_segments()
                        .and_then(|m| m.iter().next());
                    Some(ValueBytes::Here(subsegment(
                        table,
                        t.data_buffer_idx(),
                        bytes,
                        &what,
                    )?))
                } else {
                    None
                };
                if a.memory_id() == SHARED_MEMORY_ID {
                    let offset =
                        u64::from(a.memory_offset_low()) | u64::from(a.memory_offset_high()) << 32;
                    let fits = usize::try_from(offset)
                        .ok()
                        .and_then(|o| Some((o, o.checked_add(bytes)?)))
                        .filter(|&(_, end)| end <= shared_len);
                    let (offset, _) = fits.ok_or_else(|| {
                        plan_error(
                            name,
                            format!(
                                "value {v} lies outside the shared memory ({shared_len} bytes)"
                            ),
                        )
                    })?;
                    shared.push((v, offset));
                }
                if initial.is_some() || fqn.is_some() {
                    mutable.push(MutableBuffer { value: v, initial });
                }
            }
        }
    }
    Ok(MethodPlan {
        name: name.to_string(),
        values: specs,
        inputs,
        outputs,
        steps,
        payloads,
        constants,
        mutable,
        shared,
    })
}

/// Where a method that is not fully delegated runs instead.
const NOT_DELEGATED_HINT: &str = "; xnnblob's executor runs XNNPACK delegates and, for programs \
     with state, the write-back of mutable buffers (aten::copy_) and aten::expand_copy, nothing \
     else: run it inside ExecuTorch's runtime with xnnblob's backend (`xnnblob-et-run PROGRAM \
     --call METHOD:INPUTS ...`, or any app with libxnnblob_executorch)";

/// Where a method that is not fully delegated runs instead, when it plans mutable buffers in
/// the memory the methods share: the methods must share one `Module`'s arenas there.
const NOT_DELEGATED_SHARED_HINT: &str = "; xnnblob's executor runs XNNPACK delegates, the \
     write-back of mutable buffers (aten::copy_) and aten::expand_copy, nothing else: run it \
     inside ExecuTorch's runtime with xnnblob's backend, its methods sharing their mutable \
     buffers through one Module made with share_memory_arenas=true (`xnnblob-et-run PROGRAM \
     --call METHOD:INPUTS --call ...` does that; docs/executorch.md, \"Methods that share \
     state\")";

/// The read and write bits a model file may give its packed weights.
const READ_WRITE: u32 = 0o666;

/// The read and write permission bits of the file at `path` (just opened): who may read the
/// model, and so its packed weights. [`PRIVATE_MODE`](crate::cache::PRIVATE_MODE) if it cannot
/// be told.
fn mode_of_file(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map_or(crate::cache::PRIVATE_MODE, |m| {
        m.permissions().mode() & READ_WRITE
    })
}

impl Program {
    /// Maps `pte` and the external data files, merges their named data (a key in two is an
    /// error), and takes a model context from `backend`: packed weights go to `cache` (the
    /// backend's default when None).
    ///
    /// A cache file it creates is no more readable than the `.pte` and every `.ptd`
    /// ([`Backend::model_for_files`]).
    pub fn load(
        backend: &Backend,
        pte: impl AsRef<Path>,
        ptds: &[impl AsRef<Path>],
        cache: Option<&PackedCache>,
    ) -> Result<Program, ProgramError> {
        let mut maps: Vec<Arc<dyn NamedDataMap>> = Vec::new();
        let mut data_mode = READ_WRITE;
        for p in ptds {
            let map = FileDataMap::open_ptd(p.as_ref())?;
            data_mode &= mode_of_file(p.as_ref());
            maps.push(Arc::new(map));
        }
        Program::load_inner(backend, pte.as_ref(), maps, cache, data_mode)
    }

    /// As [`load`](Self::load), with external named data from any maps (linked parameters,
    /// in-memory blobs, C++ maps) instead of `.ptd` files. Whose those maps' bytes are cannot be
    /// told, so with any, a cache file it creates is
    /// [`PRIVATE_MODE`](crate::cache::PRIVATE_MODE) at most.
    pub fn load_with_maps(
        backend: &Backend,
        pte: impl AsRef<Path>,
        external: Vec<Arc<dyn NamedDataMap>>,
        cache: Option<&PackedCache>,
    ) -> Result<Program, ProgramError> {
        let data_mode = if external.is_empty() {
            READ_WRITE
        } else {
            crate::cache::PRIVATE_MODE
        };
        Program::load_inner(backend, pte.as_ref(), external, cache, data_mode)
    }

    /// As [`load_with_maps`](Self::load_with_maps); the external data allows the permission
    /// bits `data_mode`.
    fn load_inner(
        backend: &Backend,
        pte: &Path,
        external: Vec<Arc<dyn NamedDataMap>>,
        cache: Option<&PackedCache>,
        data_mode: u32,
    ) -> Result<Program, ProgramError> {
        let program = Arc::new(FileDataMap::open_pte(pte)?);
        let files_mode = data_mode & mode_of_file(pte);
        let source = program.name().to_string();
        let method_names = program_of(&program)?
            .execution_plan()
            .iter()
            .flatten()
            .map(|p| p.name().unwrap_or("").to_string())
            .collect();
        let mut maps: Vec<Arc<dyn NamedDataMap>> = vec![program.clone()];
        maps.extend(external);
        Ok(Program {
            source,
            state: shared_state_of(&program)?,
            frozen: std::sync::OnceLock::new(),
            pte: program,
            method_names,
            map: MergedMap::new(maps)?,
            model: backend.model_for_files(cache, files_mode)?,
        })
    }

    /// The names of the program's methods, in file order.
    pub fn method_names(&self) -> Vec<&str> {
        self.method_names.iter().map(String::as_str).collect()
    }

    fn plan(&self, name: &str) -> Result<MethodPlan, ProgramError> {
        read_plan(&self.pte, name).map_err(|e| self.naming_methods(e))
    }

    /// `e`, with the program's methods named when it is [`ProgramError::NoSuchMethod`].
    fn naming_methods(&self, e: ProgramError) -> ProgramError {
        match e {
            ProgramError::NoSuchMethod { name, .. } => ProgramError::NoSuchMethod {
                name,
                available: self.method_names.clone(),
            },
            other => other,
        }
    }

    /// The declared specs (dtype, bound, dynamism) of a method's inputs.
    pub fn input_specs(&self, method: &str) -> Result<Vec<ValueSpec>, ProgramError> {
        let plan = self.plan(method)?;
        specs_of(&plan, &plan.inputs)
    }

    /// The declared (largest) shapes of a method's inputs.
    pub fn input_shapes(&self, method: &str) -> Result<Vec<Vec<usize>>, ProgramError> {
        Ok(self
            .input_specs(method)?
            .iter()
            .map(|s| s.bound.dims().to_vec())
            .collect())
    }

    /// Initialises a method: one XNNPACK delegate per delegate call, and a buffer for every
    /// value it produces. Methods made here share the program's one [`SharedState`]: what one
    /// writes into a shared mutable buffer, the next one reads (ExecuTorch's `Module` with
    /// `share_memory_arenas`).
    pub fn method(&self, name: &str) -> Result<Method, ProgramError> {
        self.method_in(name, &self.state)
    }

    /// As [`method`](Self::method), with the shared mutable buffers of `state` (from
    /// [`new_state`](Self::new_state)): one more instance of the program's state, e.g. a second
    /// conversation beside the first.
    pub fn method_in(&self, name: &str, state: &SharedState) -> Result<Method, ProgramError> {
        let plan = self.plan(name)?;
        let mut delegates = Vec::new();
        for payload in &plan.payloads {
            let d =
                XnnDelegate::init(&self.model, payload.clone(), &self.map).map_err(|error| {
                    ProgramError::Delegate {
                        method: plan.name.clone(),
                        error,
                    }
                })?;
            delegates.push(d);
        }
        Method::new(plan, delegates, &self.map, state)
    }

    /// Initialises every XNNPACK delegate of a method, which packs their weights into the
    /// program's packed-weight cache, without making the method runnable: for a method whose
    /// other operators only ExecuTorch's runtime runs (an LLM's embedding and sampling), when
    /// only its packed weights are wanted (`xnnblob prepack`). The delegates live as long as
    /// what this returns.
    pub fn init_delegates(&self, name: &str) -> Result<InitializedDelegates, ProgramError> {
        let payloads = xnnpack_payloads(&self.pte, name).map_err(|e| self.naming_methods(e))?;
        let mut delegates = Vec::with_capacity(payloads.len());
        for payload in payloads {
            let d = XnnDelegate::init(&self.model, payload, &self.map).map_err(|error| {
                ProgramError::Delegate {
                    method: name.to_string(),
                    error,
                }
            })?;
            delegates.push(d);
        }
        Ok(InitializedDelegates(delegates))
    }

    /// The delegate constants that look like shared mutable buffers ExecuTorch's partitioner
    /// froze at export ([`FrozenBufferSuspect`], found by [`frozen_buffer_suspects`]): a method
    /// whose delegate holds one computes with the buffer's export-time zeros, not with what the
    /// other methods write, and nothing else says so. A face says each (its `Display` is the
    /// warning): `xnnblob run` on stderr right after the load; C++'s
    /// `Program::frozen_buffer_suspects` returns them. Empty for most programs.
    ///
    /// Looked for at the first call, from the program's file, and kept: a load that is not asked
    /// pays nothing (the check hashes as many zeros as a constant of a shared buffer's size
    /// holds). Only a program whose methods plan shared memory is looked into. The check is
    /// advice: a payload it cannot read gives none here, and is the error of the method made
    /// from it.
    pub fn frozen_buffer_suspects(&self) -> &[FrozenBufferSuspect] {
        self.frozen.get_or_init(|| {
            if self.state.is_empty() {
                Vec::new()
            } else {
                frozen_buffer_suspects(&self.pte).unwrap_or_default()
            }
        })
    }

    /// The state the methods from [`method`](Self::method) share.
    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// A fresh instance of the program's shared mutable buffers, all zero until a method made
    /// with it (by [`method_in`](Self::method_in)) writes them.
    pub fn new_state(&self) -> Result<SharedState, ProgramError> {
        shared_state_of(&self.pte)
    }

    /// The model context (packed-weight cache, workspace) all methods share.
    pub fn model(&self) -> &ModelContext {
        &self.model
    }

    /// The packed-weight cache all methods share (None when packing without a cache).
    pub fn weights_cache(&self) -> Option<&Arc<PackedWeightsCache>> {
        self.model.packed_cache()
    }

    /// The backend's shared data cache.
    pub fn shared_data(&self) -> &SharedDataCache {
        self.model.backend().shared_data()
    }

    /// The path of the `.pte` the program was loaded from, for error messages.
    pub fn path(&self) -> &str {
        &self.source
    }
}

fn specs_of(plan: &MethodPlan, values: &[usize]) -> Result<Vec<ValueSpec>, ProgramError> {
    values
        .iter()
        .map(|&v| {
            plan.values[v].ok_or_else(|| {
                plan_error(
                    &plan.name,
                    format!("value {v} is not a tensor of a supported dtype"),
                )
            })
        })
        .collect()
}

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
    fn new(
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
        let not_shared = |sources: &[Source], v: usize, what: &str| {
            match sources[v] {
            Source::Shared(_) => Err(plan_error(
                &name,
                format!("{what} value {v}, which is in the shared state (only aten::copy_ writes there)"),
            )),
            _ => Ok(()),
        }
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
                                    format!("delegate {index} writes value {a}, which it reads or the caller gives"),
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
                    ))
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

/// A method's XNNPACK delegates, initialised ([`Program::init_delegates`]): their packed
/// weights are in the program's cache while this lives.
pub struct InitializedDelegates(Vec<XnnDelegate>);

impl InitializedDelegates {
    /// How many delegates.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the method has none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
