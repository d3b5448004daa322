//! Whole ExecuTorch programs (`.pte` + external `.ptd` files) whose methods are fully delegated
//! to XNNPACK: each method's delegate calls run through [`XnnDelegate`], with the program's
//! named data merged with the external files, one shared data cache and one packed-weight cache
//! for all methods (so weights two methods share are loaded and packed once).

use crate::cache::{CacheError, PackedWeightsCache};
use crate::delegate::{DelegateError, XnnDelegate};
use crate::named_data::{
    pte_format, DataBuffer, FileDataMap, FormatError, MergedMap, NamedDataError, NamedDataMap,
};
use crate::schema::pte as fb;
use crate::shared_cache::SharedDataCache;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// Why a program or method could not be loaded or run.
#[derive(Debug)]
pub enum ProgramError {
    NamedData(NamedDataError),
    /// The program's execution plans failed validation.
    Format {
        source: String,
        error: FormatError,
    },
    Delegate {
        method: String,
        error: DelegateError,
    },
    Cache(CacheError),
    NoSuchMethod {
        name: String,
        available: Vec<String>,
    },
    /// The method runs an operator outside a delegate (or a non-XNNPACK delegate).
    NotDelegated {
        method: String,
        operator: String,
    },
    /// The plan is malformed or uses what this runner does not support.
    BadPlan {
        method: String,
        reason: String,
    },
    /// `execute` with inputs that do not fit the method.
    BadInput {
        method: String,
        reason: String,
    },
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ProgramError::*;
        match self {
            NamedData(e) => write!(f, "{e}"),
            Format { source, error } => write!(f, "{source}: {error}"),
            Delegate { method, error } => write!(f, "method {method:?}: {error}"),
            Cache(e) => write!(f, "{e}"),
            NoSuchMethod { name, available } => {
                write!(f, "no method {name:?}; the program has {available:?}")
            }
            NotDelegated { method, operator } => write!(
                f,
                "method {method:?} is not fully delegated to XNNPACK: it runs {operator}"
            ),
            BadPlan { method, reason } => write!(f, "method {method:?}: {reason}"),
            BadInput { method, reason } => write!(f, "method {method:?}: {reason}"),
        }
    }
}

impl std::error::Error for ProgramError {}

impl From<NamedDataError> for ProgramError {
    fn from(e: NamedDataError) -> Self {
        ProgramError::NamedData(e)
    }
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
    /// Shape of every tensor value (None for non-tensors).
    shapes: Vec<Option<Vec<usize>>>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    steps: Vec<Step>,
    /// The processed payload of each delegate.
    payloads: Vec<DataBuffer>,
    /// Constant (fp32) tensors of the plan, from the program's constant segment.
    constants: Vec<(usize, Vec<f32>)>,
    /// Why the method cannot run here (found while reading it): reported by `method()`.
    problem: Option<ProgramErrorKind>,
}

#[derive(Debug, Clone)]
enum ProgramErrorKind {
    NotDelegated(String),
    BadPlan(String),
}

/// A loaded program: its plans, its named data merged with external data, and the caches its
/// methods share.
pub struct Program {
    source: String,
    plans: Vec<MethodPlan>,
    map: MergedMap,
    shared: SharedDataCache,
    weights: Arc<PackedWeightsCache>,
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

/// Reads the execution plans (the flatbuffer is verified by the named-data parse first).
fn read_plans(pte: &FileDataMap) -> Result<Vec<MethodPlan>, ProgramError> {
    let file = pte.file_buffer();
    let bytes = file.data();
    let header = pte_format::parse_header(bytes).map_err(|error| ProgramError::Format {
        source: pte.source().to_string(),
        error,
    })?;
    let end = header.map_or(bytes.len(), |h| h.program_size as usize);
    let opts = crate::named_data::bytes::verifier_options();
    let program =
        flatbuffers::root_with_opts::<fb::Program>(&opts, &bytes[..end]).map_err(|e| {
            ProgramError::Format {
                source: pte.source().to_string(),
                error: FormatError::Verifier(e.to_string()),
            }
        })?;
    let inline: Vec<&[u8]> = program
        .backend_delegate_data()
        .iter()
        .flatten()
        .map(|d| d.data().map(|v| v.bytes()).unwrap_or(&[]))
        .collect();
    let constant_segment = program.constant_segment();
    let mut plans = Vec::new();
    for plan in program.execution_plan().iter().flatten() {
        let name = plan.name().unwrap_or("").to_string();
        match read_plan(
            &name,
            &plan,
            &inline,
            pte,
            &file,
            bytes,
            constant_segment.as_ref(),
        ) {
            Ok(p) => plans.push(p),
            Err(e) => plans.push(MethodPlan {
                name: name.clone(),
                shapes: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                steps: Vec::new(),
                payloads: Vec::new(),
                constants: Vec::new(),
                problem: Some(match e {
                    ProgramError::NotDelegated { operator, .. } => {
                        ProgramErrorKind::NotDelegated(operator)
                    }
                    other => ProgramErrorKind::BadPlan(other.to_string()),
                }),
            }),
        }
    }
    Ok(plans)
}

/// Reads one execution plan.
fn read_plan(
    name: &str,
    plan: &fb::ExecutionPlan<'_>,
    inline: &[&[u8]],
    pte: &FileDataMap,
    file: &DataBuffer,
    bytes: &[u8],
    constant_segment: Option<&fb::SubsegmentOffsets<'_>>,
) -> Result<MethodPlan, ProgramError> {
    let name = name.to_string();
    {
        let values: Vec<fb::EValue<'_>> = plan.values().iter().flatten().collect();
        let shapes = values
            .iter()
            .map(|v| {
                v.val_as_tensor().map(|t| {
                    t.sizes()
                        .map(|s| s.iter().map(|d| d.max(0) as usize).collect())
                        .unwrap_or_default()
                })
            })
            .collect();
        let n = values.len();
        let ids = |list: Option<flatbuffers::Vector<'_, i32>>,
                   what: &str|
         -> Result<Vec<usize>, ProgramError> {
            list.iter()
                .flatten()
                .map(|i| index(&name, i, n, what))
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
        let mut steps = Vec::new();
        let chains: Vec<fb::Chain<'_>> = plan.chains().iter().flatten().collect();
        if chains.len() > 1 {
            return Err(plan_error(
                &name,
                format!("{} chains (one is supported)", chains.len()),
            ));
        }
        let instructions: Vec<fb::Instruction<'_>> = chains
            .iter()
            .flat_map(|c| c.instructions().into_iter().flatten())
            .collect();
        for instruction in instructions {
            if let Some(k) = instruction.instr_args_as_kernel_call() {
                let operator = usize::try_from(k.op_index())
                    .ok()
                    .and_then(|i| operators.get(i))
                    .map_or_else(
                        || format!("operator #{}", k.op_index()),
                        |o| format!("the operator {o}"),
                    );
                return Err(ProgramError::NotDelegated {
                    method: name,
                    operator,
                });
            } else if let Some(d) = instruction.instr_args_as_delegate_call() {
                let i = index(&name, d.delegate_index(), delegates.len(), "delegate")?;
                let id = delegates[i].id().unwrap_or("");
                if id != "XnnpackBackend" {
                    return Err(ProgramError::NotDelegated {
                        method: name,
                        operator: format!("a delegate of backend {id:?}"),
                    });
                }
                steps.push(Step::Delegate {
                    index: i,
                    args: ids(d.args(), "delegate argument")?,
                });
            } else if let Some(m) = instruction.instr_args_as_move_call() {
                steps.push(Step::Move {
                    from: index(&name, m.move_from(), n, "move source")?,
                    to: index(&name, m.move_to(), n, "move target")?,
                });
            } else if instruction.instr_args_as_free_call().is_some() {
                // Frees a value's memory early; buffers here are dropped with the method.
            } else {
                return Err(plan_error(&name, "control flow (jump) is not supported"));
            }
        }
        let mut payloads = Vec::new();
        for (i, d) in delegates.iter().enumerate() {
            let r = d.processed().ok_or_else(|| {
                plan_error(&name, format!("delegate {i} has no payload reference"))
            })?;
            let payload = match r.location() {
                0 => {
                    let data = inline.get(r.index() as usize).ok_or_else(|| {
                        plan_error(
                            &name,
                            format!("inline payload {} does not exist", r.index()),
                        )
                    })?;
                    // The bytes are inside the mapped file: view them there, zero-copy.
                    let offset = data.as_ptr() as usize - bytes.as_ptr() as usize;
                    file.slice(offset, data.len())
                }
                1 => pte
                    .segments()
                    .get(r.index() as usize)
                    .and_then(|&(offset, size)| file.slice(offset, size)),
                other => {
                    return Err(plan_error(
                        &name,
                        format!("unknown payload location {other}"),
                    ))
                }
            }
            .ok_or_else(|| plan_error(&name, format!("delegate {i}: payload out of range")))?;
            payloads.push(payload);
        }
        let mut constants = Vec::new();
        for (v, value) in values.iter().enumerate() {
            let Some(t) = value.val_as_tensor() else {
                continue;
            };
            if t.data_buffer_idx() == 0 {
                continue;
            }
            if t.scalar_type() != 6 {
                return Err(plan_error(
                    &name,
                    format!("constant value {v} is not float32"),
                ));
            }
            let seg = constant_segment
                .ok_or_else(|| plan_error(&name, "constants but no constant segment"))?;
            let idx = t.data_buffer_idx() as usize;
            let offset = seg
                .offsets()
                .filter(|o| idx < o.len())
                .map(|o| o.get(idx))
                .ok_or_else(|| plan_error(&name, format!("constant value {v}: no offset")))?;
            let &(seg_offset, seg_size) = pte
                .segments()
                .get(seg.segment_index() as usize)
                .ok_or_else(|| plan_error(&name, "constant segment out of range"))?;
            let count: usize = t
                .sizes()
                .map_or(1, |s| s.iter().map(|d| d.max(0) as usize).product());
            let end = (offset as usize).checked_add(count * 4);
            if end.is_none_or(|end| end > seg_size) {
                return Err(plan_error(
                    &name,
                    format!("constant value {v} lies outside its segment"),
                ));
            }
            let at = seg_offset + offset as usize;
            let data = bytes[at..at + count * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
            constants.push((v, data));
        }
        Ok(MethodPlan {
            name,
            shapes,
            inputs,
            outputs,
            steps,
            payloads,
            constants,
            problem: None,
        })
    }
}

impl Program {
    /// Maps `pte` and the external data files, merges their named data (a key in two is an
    /// error), and reads the execution plans. Packed weights go to `cache` (a file path), or
    /// stay in memory.
    pub fn load(
        pte: impl AsRef<Path>,
        ptds: &[impl AsRef<Path>],
        cache: Option<&Path>,
    ) -> Result<Program, ProgramError> {
        let mut maps: Vec<Arc<dyn NamedDataMap>> = Vec::new();
        for p in ptds {
            maps.push(Arc::new(FileDataMap::open_ptd(p.as_ref())?));
        }
        Program::load_with_maps(pte, maps, cache)
    }

    /// As [`load`](Self::load), with external named data from any maps (linked parameters,
    /// in-memory blobs, C++ maps) instead of `.ptd` files.
    pub fn load_with_maps(
        pte: impl AsRef<Path>,
        external: Vec<Arc<dyn NamedDataMap>>,
        cache: Option<&Path>,
    ) -> Result<Program, ProgramError> {
        let program = FileDataMap::open_pte(pte.as_ref())?;
        let source = program.source().to_string();
        let plans = read_plans(&program)?;
        let mut maps: Vec<Arc<dyn NamedDataMap>> = vec![Arc::new(program)];
        maps.extend(external);
        let weights = match cache {
            Some(path) => PackedWeightsCache::open(path).map_err(ProgramError::Cache)?,
            None => PackedWeightsCache::in_memory(),
        };
        Ok(Program {
            source,
            plans,
            map: MergedMap::new(maps)?,
            shared: SharedDataCache::new(),
            weights,
        })
    }

    pub fn method_names(&self) -> Vec<&str> {
        self.plans.iter().map(|p| p.name.as_str()).collect()
    }

    /// The shapes of a method's inputs.
    pub fn input_shapes(&self, method: &str) -> Result<Vec<Vec<usize>>, ProgramError> {
        let plan = self.plan(method)?;
        Ok(plan
            .inputs
            .iter()
            .map(|&i| plan.shapes[i].clone().unwrap_or_default())
            .collect())
    }

    fn plan(&self, name: &str) -> Result<&MethodPlan, ProgramError> {
        self.plans
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ProgramError::NoSuchMethod {
                name: name.to_string(),
                available: self.method_names().iter().map(|s| s.to_string()).collect(),
            })
    }

    /// Initialises a method: one XNNPACK delegate per delegate call.
    pub fn method(&self, name: &str) -> Result<Method, ProgramError> {
        let plan = self.plan(name)?.clone();
        match &plan.problem {
            Some(ProgramErrorKind::NotDelegated(operator)) => {
                return Err(ProgramError::NotDelegated {
                    method: plan.name,
                    operator: operator.clone(),
                })
            }
            Some(ProgramErrorKind::BadPlan(reason)) => {
                return Err(plan_error(&plan.name, reason.clone()))
            }
            None => {}
        }
        let mut delegates = Vec::new();
        for payload in &plan.payloads {
            let d = XnnDelegate::init(
                payload.clone(),
                &self.map,
                &self.shared,
                Some(self.weights.clone()),
            )
            .map_err(|error| ProgramError::Delegate {
                method: plan.name.clone(),
                error,
            })?;
            delegates.push(d);
        }
        Ok(Method { plan, delegates })
    }

    /// The packed-weight cache all methods share.
    pub fn weights_cache(&self) -> &Arc<PackedWeightsCache> {
        &self.weights
    }

    /// The shared data cache all methods share.
    pub fn shared_data(&self) -> &SharedDataCache {
        &self.shared
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

/// An initialised method.
pub struct Method {
    plan: MethodPlan,
    delegates: Vec<XnnDelegate>,
}

impl Method {
    pub fn name(&self) -> &str {
        &self.plan.name
    }

    pub fn input_shapes(&self) -> Vec<Vec<usize>> {
        let p = &self.plan;
        p.inputs
            .iter()
            .map(|&i| p.shapes[i].clone().unwrap_or_default())
            .collect()
    }

    /// Runs the method on fp32 inputs; returns its fp32 outputs.
    pub fn execute(&mut self, inputs: &[&[f32]]) -> Result<Vec<Vec<f32>>, ProgramError> {
        let name = self.plan.name.clone();
        let bad = |reason: String| ProgramError::BadInput {
            method: name.clone(),
            reason,
        };
        if inputs.len() != self.plan.inputs.len() {
            return Err(bad(format!(
                "{} inputs given, the method takes {}",
                inputs.len(),
                self.plan.inputs.len()
            )));
        }
        let mut values: Vec<Option<Vec<f32>>> = vec![None; self.plan.shapes.len()];
        for (v, data) in &self.plan.constants {
            values[*v] = Some(data.clone());
        }
        for (n, (&v, data)) in self.plan.inputs.iter().zip(inputs).enumerate() {
            let expected: usize = self.plan.shapes[v]
                .as_ref()
                .map_or(0, |s| s.iter().product());
            if data.len() != expected {
                return Err(bad(format!(
                    "input {n} has {} elements, expected {expected}",
                    data.len()
                )));
            }
            values[v] = Some(data.to_vec());
        }
        for step in &self.plan.steps {
            match step {
                Step::Move { from, to } => values[*to] = values[*from].clone(),
                Step::Delegate { index, args } => {
                    let d = &mut self.delegates[*index];
                    let n_in = d.input_shapes().len();
                    let out_shapes = d.output_shapes();
                    if args.len() != n_in + out_shapes.len() {
                        return Err(plan_error(
                            &name,
                            format!(
                                "delegate {index} takes {} arguments, the call passes {}",
                                n_in + out_shapes.len(),
                                args.len()
                            ),
                        ));
                    }
                    let ins: Vec<&[f32]> = args[..n_in]
                        .iter()
                        .map(|&a| {
                            values[a].as_deref().ok_or_else(|| {
                                plan_error(&name, format!("value {a} is read before it is written"))
                            })
                        })
                        .collect::<Result<_, _>>()?;
                    let mut outs: Vec<Vec<f32>> = out_shapes
                        .iter()
                        .map(|s| vec![0.0; s.iter().product()])
                        .collect();
                    let mut out_refs: Vec<&mut [f32]> =
                        outs.iter_mut().map(Vec::as_mut_slice).collect();
                    d.execute(&ins, &mut out_refs)
                        .map_err(|error| ProgramError::Delegate {
                            method: name.clone(),
                            error,
                        })?;
                    for (&a, out) in args[n_in..].iter().zip(outs) {
                        values[a] = Some(out);
                    }
                }
            }
        }
        self.plan
            .outputs
            .iter()
            .map(|&o| {
                values[o]
                    .take()
                    .ok_or_else(|| plan_error(&name, format!("output value {o} is never written")))
            })
            .collect()
    }
}
