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
mod error;
mod method;
mod pack_ahead;
mod shared_state;

pub use error::{InputError, ProgramError};
pub use method::{Method, rows_for};
pub use pack_ahead::{PackedAhead, pack_ahead};
pub use shared_state::{SHARED_MEMORY_ID, SharedState};

use crate::backend::{Backend, ModelContext, WeightsCacheChoice};
use crate::cache::PackedWeightsCache;
use crate::delegate::XnnDelegate;
use crate::named_data::{
    DataBuffer, FileDataMap, FormatError, MergedMap, NamedDataMap, pte_format,
};
use crate::schema::pte as fb;
use crate::shared_data::SharedDataCache;
use crate::tensor::{DType, Shape, TooManyDims};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

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
    let opts = crate::schema::verifier_options();
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
                ));
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
                    });
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
        cache: Option<&WeightsCacheChoice>,
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
        cache: Option<&WeightsCacheChoice>,
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
        cache: Option<&WeightsCacheChoice>,
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
