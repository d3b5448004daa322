//! XNNPACK's `xnn_status` as a typed Rust error.

use super::subgraph::Datatype;
use crate::tensor::{DType, ShapeMismatch};
use std::fmt;
use xnnpack_sys as sys;

/// A non-success `xnn_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Uninitialized,
    InvalidParameter,
    InvalidState,
    UnsupportedParameter,
    UnsupportedHardware,
    OutOfMemory,
    ReallocationRequired,
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
    Call { call: &'static str, status: Status },
    /// An external tensor's buffer does not match the shape the runtime expects.
    #[error(
        "external value {id}: buffer holds {given_elements} elements, the runtime expects {expected_elements}"
    )]
    ExternalSize {
        id: u32,
        expected_elements: usize,
        given_elements: usize,
    },
    /// Static data does not have as many bytes as a tensor of its shape and datatype takes
    /// ([`Datatype::tensor_bytes`]; `usize::MAX` when that overflows).
    #[error(
        "static {datatype:?} data holds {given_bytes} bytes, its shape needs {expected_bytes}"
    )]
    StaticDataSize {
        datatype: Datatype,
        expected_bytes: usize,
        given_bytes: usize,
    },
    /// Static data does not start at a multiple of its datatype's element size.
    #[error("static {datatype:?} data is not aligned to {alignment} bytes")]
    StaticDataAlignment {
        datatype: Datatype,
        alignment: usize,
    },
    /// A quantized tensor was given a different number of scales than its shape needs.
    #[error("quantized tensor given {given} scales, its shape needs {expected}")]
    QuantizationScales { expected: usize, given: usize },
    /// `id` is not an external value of this runtime, or is bound twice.
    #[error("external value {id} is not an unbound input or output of this runtime")]
    UnknownExternal { id: u32 },
    /// The external input or output `id` was not bound.
    #[error("external value {id} is not bound")]
    MissingExternal { id: u32 },
    /// An external value of a datatype no buffer can be bound to (per-channel, blockwise or
    /// dynamically quantized).
    #[error("external value {id} is {datatype:?}, which no buffer can be bound to")]
    UnsupportedExternal { id: u32, datatype: Datatype },
    /// A buffer of `bytes` (None: a size that overflows) could not be allocated.
    #[error(fmt = out_of_memory)]
    OutOfMemory { bytes: Option<usize> },
    /// A run was given the wrong number of inputs or outputs.
    #[error("{given} {what} given, the graph has {expected}")]
    Arity {
        what: &'static str,
        expected: usize,
        given: usize,
    },
    /// Input or output `index` (by ascending external id) has another dtype than the graph's.
    #[error("{what} {index} is {given}, the graph takes {expected}")]
    DtypeMismatch {
        what: &'static str,
        index: usize,
        expected: DType,
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
        index: usize,
        shapes: Box<ShapeMismatch>,
    },
    /// Input or output `index` has fewer bytes than its shape needs (`needed` None: the size
    /// overflows).
    #[error(fmt = buffer_too_small)]
    BufferTooSmall {
        what: &'static str,
        index: usize,
        needed: Option<usize>,
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

fn buffer_too_small(
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
