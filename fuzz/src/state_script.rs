//! The `state` target's input: declarations of a stateful program (buffers, banks, initial
//! values), its methods (one of the fixed state graphs each, with bindings of externals to
//! buffers), then the calls made on it. [`Script::decode`] reads any bytes; [`Script::encode`]
//! writes the bytes that decode to a script, for the corpus.

use crate::reader::Reader;
use xnnblob::state::{InitialState, StateSpec};

/// Buffer names a declaration or binding picks from (a small set, so that names collide).
pub const STATE_NAMES: [&str; 4] = ["s", "window", "cross", ""];
/// A binding may also name this buffer, which no declaration does.
pub const UNKNOWN_STATE: &str = "unknown";
/// The graphs a method may run (see [`crate::graphs`]).
pub const STATE_GRAPHS: [&str; 5] = [
    "state_add",
    "state_get",
    "state_set",
    "state_window",
    "state_fc",
];
/// Method names: one per graph, and one more, so that names collide with graphs they do not run.
pub const METHOD_NAMES: [&str; 6] = ["add", "get", "set", "window", "fc", "other"];

/// The initial-state keys a declaration picks from after `Zeros`: the fixtures' initial values
/// and one graph constant (128 floats).
pub fn initial_keys() -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = crate::INITIAL_KEYS.iter().map(|(k, _)| *k).collect();
    keys.push(crate::graph("fc_fp32").blobs[0].0.as_str());
    keys
}

const LARGE_DIM: u8 = 0xf0;
const MAX_BANK: u8 = 0xff;

/// A declared buffer, as indices into the tables above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decl {
    /// Index into [`STATE_NAMES`].
    pub name: usize,
    /// The shape (any `usize`; values above 8 take nine bytes).
    pub dims: Vec<usize>,
    /// The bank id (below 3, or `usize::MAX`).
    pub bank: usize,
    /// 0: zeros; `k`: the named value `initial_keys()[k - 1]`.
    pub initial: usize,
}

/// A binding of external `external` to buffer `state` (index into [`STATE_NAMES`], or its
/// length for [`UNKNOWN_STATE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The external id (below 6).
    pub external: u32,
    /// The buffer's name index.
    pub state: usize,
}

/// A method: name, graph, bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodDecl {
    /// Index into [`METHOD_NAMES`].
    pub name: usize,
    /// Index into [`STATE_GRAPHS`].
    pub graph: usize,
    /// Inputs bound to buffers (at most 2).
    pub reads: Vec<Binding>,
    /// Outputs bound to buffers (at most 2).
    pub writes: Vec<Binding>,
}

/// One call on the program or its instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A new instance in host memory, replacing the current one.
    Instantiate,
    /// A new instance in banks the caller makes: one more or fewer than the layout has
    /// (`banks_delta` 0, 1, 2 for -1, 0, +1), each `size_delta` bytes off the size it needs.
    InstantiateIn {
        /// Index into -1, 0, +1.
        banks_delta: usize,
        /// Bytes added to each bank's needed size (negative: too small).
        size_delta: i8,
    },
    /// Loads the method [`METHOD_NAMES`]`[method]`.
    Load(usize),
    /// Executes a method with inputs of these lengths (fp32 values, below 41).
    Execute(usize, Vec<usize>),
    /// Re-applies the initial state.
    Reset,
    /// Reads the buffer [`STATE_NAMES`]`[name]` (or [`UNKNOWN_STATE`]).
    Read(usize),
}

/// A whole input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Script {
    /// The declared buffers.
    pub decls: Vec<Decl>,
    /// The methods.
    pub methods: Vec<MethodDecl>,
    /// The calls, at most [`MAX_OPS`].
    pub ops: Vec<Op>,
}

/// The most calls one input makes.
pub const MAX_OPS: usize = 12;

fn binding_name(i: usize) -> &'static str {
    STATE_NAMES.get(i).copied().unwrap_or(UNKNOWN_STATE)
}

impl Script {
    /// The script any bytes stand for.
    pub fn decode(bytes: &[u8]) -> Script {
        let mut r = Reader::new(bytes);
        let keys = initial_keys().len();
        let decls = (0..r.choose(7))
            .map(|_| Decl {
                name: r.choose(STATE_NAMES.len()),
                dims: (0..r.choose(5))
                    .map(|_| match r.u8() {
                        b if b >= LARGE_DIM => r.u64() as usize,
                        b => usize::from(b % 9),
                    })
                    .collect(),
                bank: match r.u8() {
                    MAX_BANK => usize::MAX,
                    b => usize::from(b % 3),
                },
                initial: r.choose(keys + 1),
            })
            .collect();
        let bindings = |r: &mut Reader<'_>| -> Vec<Binding> {
            (0..r.choose(3))
                .map(|_| Binding {
                    external: u32::from(r.u8() % 6),
                    state: r.choose(STATE_NAMES.len() + 1),
                })
                .collect()
        };
        let methods = (0..r.choose(4))
            .map(|_| {
                let name = r.choose(METHOD_NAMES.len());
                let graph = r.choose(STATE_GRAPHS.len());
                let reads = bindings(&mut r);
                let writes = bindings(&mut r);
                MethodDecl {
                    name,
                    graph,
                    reads,
                    writes,
                }
            })
            .collect();
        let mut ops = Vec::new();
        while !r.is_empty() && ops.len() < MAX_OPS {
            ops.push(match r.choose(6) {
                0 => Op::Instantiate,
                1 => Op::InstantiateIn {
                    banks_delta: r.choose(3),
                    size_delta: r.u8() as i8,
                },
                2 => Op::Load(r.choose(METHOD_NAMES.len())),
                3 => {
                    let method = r.choose(METHOD_NAMES.len());
                    let inputs = (0..r.choose(4)).map(|_| r.choose(41)).collect();
                    Op::Execute(method, inputs)
                }
                4 => Op::Reset,
                _ => Op::Read(r.choose(STATE_NAMES.len() + 1)),
            });
        }
        Script {
            decls,
            methods,
            ops,
        }
    }

    /// Bytes that [`decode`](Self::decode) to this script (indices must be in range).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.decls.len() as u8];
        for d in &self.decls {
            out.push(d.name as u8);
            out.push(d.dims.len() as u8);
            for &dim in &d.dims {
                if dim <= 8 {
                    out.push(dim as u8);
                } else {
                    out.push(LARGE_DIM);
                    out.extend_from_slice(&(dim as u64).to_le_bytes());
                }
            }
            out.push(if d.bank == usize::MAX {
                MAX_BANK
            } else {
                d.bank as u8
            });
            out.push(d.initial as u8);
        }
        out.push(self.methods.len() as u8);
        let bindings = |out: &mut Vec<u8>, list: &[Binding]| {
            out.push(list.len() as u8);
            for b in list {
                out.push(b.external as u8);
                out.push(b.state as u8);
            }
        };
        for m in &self.methods {
            out.push(m.name as u8);
            out.push(m.graph as u8);
            bindings(&mut out, &m.reads);
            bindings(&mut out, &m.writes);
        }
        for op in &self.ops {
            match op {
                Op::Instantiate => out.push(0),
                Op::InstantiateIn {
                    banks_delta,
                    size_delta,
                } => out.extend_from_slice(&[1, *banks_delta as u8, *size_delta as u8]),
                Op::Load(m) => out.extend_from_slice(&[2, *m as u8]),
                Op::Execute(m, inputs) => {
                    out.extend_from_slice(&[3, *m as u8, inputs.len() as u8]);
                    out.extend(inputs.iter().map(|&n| n as u8));
                }
                Op::Reset => out.push(4),
                Op::Read(s) => out.extend_from_slice(&[5, *s as u8]),
            }
        }
        out
    }

    /// The declarations as the library takes them.
    pub fn specs(&self) -> Vec<StateSpec> {
        let keys = initial_keys();
        self.decls
            .iter()
            .map(|d| StateSpec {
                name: STATE_NAMES[d.name].to_string(),
                shape: d.dims.clone(),
                bank: d.bank,
                initial: match d.initial {
                    0 => InitialState::Zeros,
                    k => InitialState::Named(keys[k - 1].to_string()),
                },
            })
            .collect()
    }

    /// The bindings of a method as the library takes them.
    pub fn named(list: &[Binding]) -> Vec<(u32, String)> {
        list.iter()
            .map(|b| (b.external, binding_name(b.state).to_string()))
            .collect()
    }
}

/// The name [`Op::Read`] and bindings use for index `i`.
pub fn state_name(i: usize) -> &'static str {
    binding_name(i)
}
