//! XNNPACK's `xnn_status` as a typed Rust error.

use super::datatype::Datatype;
use crate::tensor::{DType, ShapeMismatch};
use std::fmt;
use xnnpack_sys as sys;

/// A non-success `xnn_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `xnn_status_uninitialized`: XNNPACK is not initialised (`xnn_initialize` was not called
    /// or failed).
    Uninitialized,
    /// `xnn_status_invalid_parameter`: an argument is out of range or inconsistent with the
    /// others; also what the wrappers report for calls they refuse to make.
    InvalidParameter,
    /// `xnn_status_invalid_state`: the call is not allowed in the object's current state, e.g.
    /// setting up a runtime before its weights cache is finalized.
    InvalidState,
    /// `xnn_status_unsupported_parameter`: a valid argument this XNNPACK build does not support.
    UnsupportedParameter,
    /// `xnn_status_unsupported_hardware`: this CPU lacks the instructions XNNPACK needs.
    UnsupportedHardware,
    /// `xnn_status_out_of_memory`: an allocation failed; also reported when a create call
    /// returns no handle.
    OutOfMemory,
    /// `xnn_status_reallocation_required`: a reshape outgrew the memory planned for a tensor or
    /// the workspace (normally handled inside `xnn_reshape_runtime`).
    ReallocationRequired,
    /// `xnn_status_deprecated`: the function is deprecated or not supported by this XNNPACK
    /// build.
    Deprecated,
    /// A code this build of xnnblob does not know.
    Unknown(u32),
}

impl Status {
    fn from_raw(raw: sys::xnn_status) -> Option<Status> {
        Some(match raw {
            sys::xnn_status_success => return None,
            sys::xnn_status_uninitialized => Status::Uninitialized,
            sys::xnn_status_invalid_parameter => Status::InvalidParameter,
            sys::xnn_status_invalid_state => Status::InvalidState,
            sys::xnn_status_unsupported_parameter => Status::UnsupportedParameter,
            sys::xnn_status_unsupported_hardware => Status::UnsupportedHardware,
            sys::xnn_status_out_of_memory => Status::OutOfMemory,
            sys::xnn_status_reallocation_required => Status::ReallocationRequired,
            sys::xnn_status_deprecated => Status::Deprecated,
            other => Status::Unknown(other),
        })
    }
}

/// An XNNPACK call failed, or a wrapper refused to make it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XnnError {
    /// `call` returned `status`.
    #[error("XNNPACK {call} failed: {status:?}")]
    Call {
        /// The function called: an XNNPACK entry point such as `"xnn_create_runtime_v4"`.
        call: &'static str,
        /// The status it returned.
        status: Status,
    },
    /// A thread pool could not start one of its worker threads.
    #[error("thread pool of {threads} threads: cannot start worker {index}: {reason}")]
    PoolThread {
        /// The worker that failed (1 is the first; the caller is 0).
        index: usize,
        /// The threads the pool was to have.
        threads: usize,
        /// The operating system's reason.
        reason: String,
    },
    /// An external tensor's buffer does not match the shape the runtime expects.
    #[error(
        "external value {id}: buffer holds {given_elements} elements, the runtime expects {expected_elements}"
    )]
    ExternalSize {
        /// The external value id of the input or output.
        id: u32,
        /// Elements of its current shape (`usize::MAX` when the count overflows).
        expected_elements: usize,
        /// Elements the caller's buffer holds.
        given_elements: usize,
    },
    /// Static data does not have as many bytes as a tensor of its shape and datatype takes
    /// ([`Datatype::tensor_bytes`]; `usize::MAX` when that overflows).
    #[error("static {datatype:?} data holds {given_bytes} bytes, its shape needs {expected_bytes}")]
    StaticDataSize {
        /// The XNNPACK datatype of the tensor.
        datatype: Datatype,
        /// Bytes a tensor of its shape and datatype takes.
        expected_bytes: usize,
        /// Bytes of static data given.
        given_bytes: usize,
    },
    /// Static data does not start at a multiple of its datatype's element size.
    #[error("static {datatype:?} data is not aligned to {alignment} bytes")]
    StaticDataAlignment {
        /// The XNNPACK datatype of the tensor.
        datatype: Datatype,
        /// The alignment in bytes the data needs: the datatype's element size.
        alignment: usize,
    },
    /// A quantized tensor was given a different number of scales than its shape needs.
    #[error("quantized tensor given {given} scales, its shape needs {expected}")]
    QuantizationScales {
        /// Scales the shape needs: one per channel along `channel_dim`, or one per block.
        expected: usize,
        /// Scales given.
        given: usize,
    },
    /// `id` is not an external value of this runtime, or is bound twice.
    #[error("external value {id} is not an unbound input or output of this runtime")]
    UnknownExternal {
        /// The external value id the caller gave.
        id: u32,
    },
    /// The external input or output `id` was not bound.
    #[error("external value {id} is not bound")]
    MissingExternal {
        /// The external value id no buffer was given for.
        id: u32,
    },
    /// An external value of a datatype no buffer can be bound to (per-channel, blockwise or
    /// dynamically quantized).
    #[error("external value {id} is {datatype:?}, which no buffer can be bound to")]
    UnsupportedExternal {
        /// The external value id of the input or output.
        id: u32,
        /// Its XNNPACK datatype.
        datatype: Datatype,
    },
    /// A buffer of `bytes` (None: a size that overflows) could not be allocated.
    #[error(fmt = out_of_memory)]
    OutOfMemory {
        /// Size in bytes of the allocation that failed; None when computing it overflowed.
        bytes: Option<usize>,
    },
    /// A run was given the wrong number of inputs or outputs.
    #[error("{given} {what} given, the graph has {expected}")]
    Arity {
        /// `"inputs"` or `"outputs"`.
        what: &'static str,
        /// How many the graph has.
        expected: usize,
        /// How many the call was given.
        given: usize,
    },
    /// Input or output `index` (by ascending external id) has another dtype than the graph's.
    #[error("{what} {index} is {given}, the graph takes {expected}")]
    DtypeMismatch {
        /// `"input"` or `"output"`.
        what: &'static str,
        /// Its position among the inputs or outputs, by ascending external id.
        index: usize,
        /// The dtype the graph declares for it.
        expected: DType,
        /// The dtype of the caller's buffer.
        given: DType,
    },
    /// Input `index` has a shape outside the declared one (another rank, or a larger
    /// dimension).
    #[error(
        "input {index} has shape {}, outside the declared bound {} \
         (same rank, each dimension at most the bound's)",
        .shapes.given,
        .shapes.bound
    )]
    ShapeOutOfBounds {
        /// The input's position among the inputs, by ascending external id.
        index: usize,
        /// The shape given and the declared bound (boxed to keep the error small).
        shapes: Box<ShapeMismatch>,
    },
    /// Input `index`, which the graph reads under a fixed shape (a static reshape folded into
    /// its binding), was given a shape of another number of elements.
    #[error(
        "input {index} has shape {}, which does not hold the {} elements of its declared \
         shape {}: the graph reads this input under a fixed shape",
        .shapes.given,
        .shapes.bound.numel().unwrap_or(usize::MAX),
        .shapes.bound
    )]
    ReshapedInputSize {
        /// The input's position among the inputs, by ascending external id.
        index: usize,
        /// The shape given and the declared one (boxed to keep the error small).
        shapes: Box<ShapeMismatch>,
    },
    /// Input or output `index` has fewer bytes than its shape needs (`needed` None: the size
    /// overflows).
    #[error(fmt = buffer_too_small)]
    BufferTooSmall {
        /// `"input"` or `"output"`.
        what: &'static str,
        /// Its position among the inputs or outputs, by ascending external id.
        index: usize,
        /// Bytes its shape needs; None when that size overflows.
        needed: Option<usize>,
        /// Bytes the caller's buffer holds (readable for an input, writable for an output).
        given: usize,
    },
}

impl XnnError {
    /// The XNNPACK status, when the error came from XNNPACK.
    pub fn status(&self) -> Option<Status> {
        match self {
            XnnError::Call { status, .. } => Some(*status),
            _ => None,
        }
    }
}

// The two messages below depend on whether a size is known, which a format string cannot
// branch on.

fn out_of_memory(bytes: &Option<usize>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match bytes {
        Some(n) => write!(f, "could not allocate {n} bytes"),
        None => f.write_str("a buffer size overflows"),
    }
}

/// The message of a buffer shorter than its shape needs (here and for a method's inputs).
pub(crate) fn buffer_too_small(
    what: &&'static str,
    index: &usize,
    needed: &Option<usize>,
    given: &usize,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    match needed {
        Some(needed) => write!(
            f,
            "{what} {index} holds {given} bytes, its shape needs {needed}"
        ),
        None => write!(
            f,
            "{what} {index} holds {given} bytes; the size its shape needs overflows"
        ),
    }
}

/// Turns a raw status of `call` into a `Result`.
pub(crate) fn check(call: &'static str, raw: sys::xnn_status) -> Result<(), XnnError> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => Err(XnnError::Call { call, status }),
    }
}
