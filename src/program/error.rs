//! Why a program or one of its methods could not be loaded or run, or a call's inputs were
//! refused.

use crate::backend::BackendError;
use crate::delegate::DelegateError;
use crate::named_data::{FormatError, NamedDataError};
use crate::tensor::{DType, ShapeMismatch};
use std::fmt;

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
    /// The program's packed-weight cache failed (saving what [`pack_ahead()`](super::pack_ahead()) packed).
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
