//! Whole ExecuTorch programs (`.pte` + external `.ptd` files) whose methods are fully delegated
//! to XNNPACK: each method's delegate calls run through [`XnnDelegate`], with the program's
//! named data merged with the external files, loaded through the [`Backend`] so that weights
//! two methods, or two programs, share are loaded and packed once.
//!
//! A [`Method`] holds a buffer for every value it produces, sized for the value's declared
//! bound, made once at init: an execute binds the caller's inputs and these buffers to the
//! delegates in place, reshapes only when a shape changed, and allocates nothing.

use crate::backend::{Backend, BackendError, ModelContext, PackedCache};
use crate::cache::PackedWeightsCache;
use crate::delegate::{DelegateError, XnnDelegate};
use crate::named_data::{
    pte_format, DataBuffer, FileDataMap, FormatError, MergedMap, NamedDataError, NamedDataMap,
};
use crate::schema::pte as fb;
use crate::shared_cache::SharedDataCache;
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
    /// Run delegate `index` with these value indices as inputs, then outputs.
    Delegate {
        index: usize,
        args: Vec<usize>,
    },
    Move {
        from: usize,
        to: usize,
    },
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
    /// Constant tensors of the plan, viewed in the program's constant segment.
    constants: Vec<(usize, DataBuffer)>,
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
/// are exported), so that method never sees what another method writes (issue 43; the README
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

/// The delegate constants of `pte` that look like frozen shared buffers (see
/// [`FrozenBufferSuspect`]): read from the plans and the payloads' constant tables, with one
/// sha256 of zeros per size of a constant in the program's named data that some shared buffer
/// has; nothing is loaded. Constants kept in a `.ptd` are not looked at.
pub fn frozen_buffer_suspects(pte: &FileDataMap) -> Result<Vec<FrozenBufferSuspect>, ProgramError> {
    // The memory id `share_mutable_buffers` plans every mutable buffer in, shared by all methods.
    const SHARED_STATE: u32 = 2;
    let program = program_of(pte)?;
    let mut buffers: std::collections::BTreeMap<usize, Vec<String>> = Default::default();
    for plan in program.execution_plan().iter().flatten() {
        let method = plan.name().unwrap_or("");
        for (v, value) in plan.values().iter().flatten().enumerate() {
            let Some(t) = value.val_as_tensor() else {
                continue;
            };
            if t.allocation_info().map(|a| a.memory_id()) != Some(SHARED_STATE) {
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
            let summary =
                crate::delegate::summarize(payload).map_err(|error| ProgramError::Delegate {
                    method: method.clone(),
                    error,
                })?;
            for key in summary.constant_keys {
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

/// Reads one execution plan.
fn read_plan(pte: &FileDataMap, name: &str) -> Result<MethodPlan, ProgramError> {
    let program = program_of(pte)?;
    let file = pte.file_buffer();
    let plan = program
        .execution_plan()
        .iter()
        .flatten()
        .find(|p| p.name().unwrap_or("") == name)
        .ok_or_else(|| ProgramError::NoSuchMethod {
            name: name.to_string(),
            available: Vec::new(),
        })?;
    let values: Vec<fb::EValue<'_>> = plan.values().iter().flatten().collect();
    let n = values.len();
    let mut specs = Vec::with_capacity(n);
    for (v, value) in values.iter().enumerate() {
        specs.push(match value.val_as_tensor() {
            Some(t) => value_spec(name, v, &t)?,
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
    let operators: Vec<String> = plan
        .operators()
        .iter()
        .flatten()
        .map(|o| {
            let (op, overload) = (o.name().unwrap_or("?"), o.overload().unwrap_or(""));
            if overload.is_empty() {
                op.to_string()
            } else {
                format!("{op}.{overload}")
            }
        })
        .collect();
    let delegates: Vec<fb::BackendDelegate<'_>> = plan.delegates().iter().flatten().collect();
    let chains: Vec<fb::Chain<'_>> = plan.chains().iter().flatten().collect();
    if chains.len() > 1 {
        return Err(plan_error(
            name,
            format!("{} chains (one is supported)", chains.len()),
        ));
    }
    let mut steps = Vec::new();
    for instruction in chains
        .iter()
        .flat_map(|c| c.instructions().into_iter().flatten())
    {
        if let Some(k) = instruction.instr_args_as_kernel_call() {
            let operator = usize::try_from(k.op_index())
                .ok()
                .and_then(|i| operators.get(i))
                .map_or_else(
                    || format!("operator #{}", k.op_index()),
                    |o| format!("the operator {o}"),
                );
            // A mutable buffer's write-back: the program keeps state between calls, perhaps
            // shared by its methods, which this executor does not run.
            let hint = if operator.contains("aten::copy_") {
                "; that is the write-back of a mutable buffer (state kept between calls, which \
                 methods exported with share_mutable_buffers share): run it inside ExecuTorch's \
                 runtime with xnnblob's backend, its methods on one Module with \
                 share_memory_arenas (`xnnblob-et-run PROGRAM --call METHOD:INPUTS ...` does)"
            } else {
                ""
            };
            return Err(ProgramError::NotDelegated {
                method: name.to_string(),
                operator,
                hint,
            });
        } else if let Some(d) = instruction.instr_args_as_delegate_call() {
            let i = index(name, d.delegate_index(), delegates.len(), "delegate")?;
            let id = delegates[i].id().unwrap_or("");
            if id != "XnnpackBackend" {
                return Err(ProgramError::NotDelegated {
                    method: name.to_string(),
                    operator: format!("a delegate of backend {id:?}"),
                    hint: "",
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
    let constant_segment = program.constant_segment();
    let mut constants = Vec::new();
    for (v, value) in values.iter().enumerate() {
        let Some(t) = value.val_as_tensor() else {
            continue;
        };
        if t.data_buffer_idx() == 0 {
            continue;
        }
        let spec = specs[v].ok_or_else(|| {
            plan_error(
                name,
                format!("constant value {v} has scalar type {}", t.scalar_type()),
            )
        })?;
        let seg = constant_segment
            .as_ref()
            .ok_or_else(|| plan_error(name, "constants but no constant segment"))?;
        let idx = t.data_buffer_idx() as usize;
        let offset = seg
            .offsets()
            .filter(|o| idx < o.len())
            .map(|o| o.get(idx))
            .ok_or_else(|| plan_error(name, format!("constant value {v}: no offset")))?;
        let &(seg_offset, seg_size) = pte
            .segments()
            .get(seg.segment_index() as usize)
            .ok_or_else(|| plan_error(name, "constant segment out of range"))?;
        let size = spec.bound.nbytes(spec.dtype).unwrap_or(usize::MAX);
        let outside = || plan_error(name, format!("constant value {v} lies outside its segment"));
        let offset = usize::try_from(offset).map_err(|_| outside())?;
        if offset.checked_add(size).is_none_or(|end| end > seg_size) {
            return Err(outside());
        }
        let at = seg_offset.checked_add(offset).ok_or_else(outside)?;
        constants.push((v, file.slice(at, size).ok_or_else(outside)?));
    }
    Ok(MethodPlan {
        name: name.to_string(),
        values: specs,
        inputs,
        outputs,
        steps,
        payloads,
        constants,
    })
}

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
        read_plan(&self.pte, name).map_err(|e| match e {
            ProgramError::NoSuchMethod { name, .. } => ProgramError::NoSuchMethod {
                name,
                available: self.method_names.clone(),
            },
            other => other,
        })
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
    /// value it produces.
    pub fn method(&self, name: &str) -> Result<Method, ProgramError> {
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
        Method::new(plan, delegates)
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
    /// Never written before it is read: rejected at init.
    Unset,
}

/// An initialised method.
pub struct Method {
    plan: MethodPlan,
    delegates: Vec<XnnDelegate>,
    /// A buffer for every value a step writes, every constant, and every output.
    buffers: Vec<Option<PaddedTensor>>,
    /// Where each value is read from.
    sources: Vec<Source>,
}

impl Method {
    /// Checks the plan against the delegates (arity, dtypes, values written before read) and
    /// makes every buffer.
    fn new(plan: MethodPlan, delegates: Vec<XnnDelegate>) -> Result<Method, ProgramError> {
        let name = plan.name.clone();
        let n = plan.values.len();
        let mut sources = vec![Source::Unset; n];
        let mut buffers: Vec<Option<PaddedTensor>> = (0..n).map(|_| None).collect();
        let make = |buffers: &mut Vec<Option<PaddedTensor>>, v: usize| {
            if buffers[v].is_some() {
                return Ok(());
            }
            let spec = plan.values[v].ok_or_else(|| {
                plan_error(
                    &name,
                    format!("value {v} is not a tensor of a supported dtype"),
                )
            })?;
            let t = PaddedTensor::zeros(spec.dtype, spec.bound)
                .map_err(|e| plan_error(&name, format!("value {v}: {e}")))?;
            buffers[v] = Some(t);
            Ok::<(), ProgramError>(())
        };
        specs_of(&plan, &plan.inputs)?;
        for (k, &v) in plan.inputs.iter().enumerate() {
            sources[v] = Source::Input(k);
        }
        for (v, data) in &plan.constants {
            make(&mut buffers, *v)?;
            let t = buffers[*v].as_mut().expect("made");
            t.data_mut().copy_from_slice(data.data());
            sources[*v] = Source::Buffer;
        }
        for step in &plan.steps {
            match step {
                Step::Delegate { index, args } => {
                    let d = &delegates[*index];
                    let n_in = d.inputs().len();
                    if args.len() != n_in + d.outputs().len() {
                        return Err(plan_error(
                            &name,
                            format!(
                                "delegate {index} takes {} arguments, the call passes {}",
                                n_in + d.outputs().len(),
                                args.len()
                            ),
                        ));
                    }
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
                            make(&mut buffers, a)?;
                            sources[a] = Source::Buffer;
                        }
                    }
                }
                Step::Move { from, to } => {
                    if sources[*from] == Source::Unset {
                        return Err(plan_error(
                            &name,
                            format!("value {from} is moved before it is written"),
                        ));
                    }
                    if plan.values[*from].map(|s| s.dtype) != plan.values[*to].map(|s| s.dtype) {
                        return Err(plan_error(
                            &name,
                            format!("move from value {from} to {to} changes the dtype"),
                        ));
                    }
                    make(&mut buffers, *to)?;
                    sources[*to] = Source::Buffer;
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
                // An input returned as an output: copied into a buffer at each execute.
                Source::Input(_) => make(&mut buffers, o)?,
                Source::Buffer => {}
            }
        }
        Ok(Method {
            plan,
            delegates,
            buffers,
            sources,
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
        for s in 0..self.plan.steps.len() {
            match &self.plan.steps[s] {
                Step::Delegate { index, args } => {
                    let (index, n_in) = (*index, self.delegates[*index].inputs().len());
                    let buffers = self.buffers.as_mut_ptr();
                    let sources = &self.sources;
                    let input = |i: usize| {
                        let a = args[i];
                        match sources[a] {
                            Source::Input(k) => RawInput::of(&inputs[k]),
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
                        // SAFETY: as above; output arguments are distinct buffers, not read by
                        // this call, so this is the only access to `a` during it.
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
                    // slack) or this method's buffers; outputs are buffers with their
                    // capacities; all outlive the call, and no output aliases an input.
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
                &Step::Move { from, to } => self.copy_value(from, to, inputs),
            }
        }
        for i in 0..self.plan.outputs.len() {
            let o = self.plan.outputs[i];
            if let Source::Input(_) = self.sources[o] {
                self.copy_value(o, o, inputs);
            }
        }
        Ok(())
    }

    /// Copies value `from` (an input or a buffer) into the buffer of `to`.
    fn copy_value(&mut self, from: usize, to: usize, inputs: &[TensorRef<'_>]) {
        let (shape, bytes): (Shape, *const u8) = match self.sources[from] {
            Source::Input(k) => (*inputs[k].shape(), inputs[k].data().as_ptr()),
            _ => {
                let t = self.buffers[from].as_ref().expect("made at init");
                (*t.shape(), t.data().as_ptr())
            }
        };
        if from == to && self.sources[from] == Source::Buffer {
            return;
        }
        let t = self.buffers[to].as_mut().expect("made at init");
        if t.set_shape(shape) {
            let n = t.data().len();
            // SAFETY: the source holds at least the shape's bytes (inputs checked in execute,
            // buffers by construction); `to` is another buffer, or an input's own buffer.
            unsafe { std::ptr::copy(bytes, t.data_mut().as_mut_ptr(), n) };
        }
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
