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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XnnError {
    /// `call` returned `status`.
    Call { call: &'static str, status: Status },
    /// An external tensor's buffer does not match the shape the runtime expects.
    ExternalSize {
        id: u32,
        expected_elements: usize,
        given_elements: usize,
    },
    /// Static data does not have as many bytes as a tensor of its shape and datatype takes
    /// ([`Datatype::tensor_bytes`]; `usize::MAX` when that overflows).
    StaticDataSize {
        datatype: Datatype,
        expected_bytes: usize,
        given_bytes: usize,
    },
    /// Static data does not start at a multiple of its datatype's element size.
    StaticDataAlignment {
        datatype: Datatype,
        alignment: usize,
    },
    /// A quantized tensor was given a different number of scales than its shape needs.
    QuantizationScales { expected: usize, given: usize },
    /// `id` is not an external value of this runtime, or is bound twice.
    UnknownExternal { id: u32 },
    /// The external input or output `id` was not bound.
    MissingExternal { id: u32 },
    /// An external value of a datatype no buffer can be bound to (per-channel, blockwise or
    /// dynamically quantized).
    UnsupportedExternal { id: u32, datatype: Datatype },
    /// A buffer of `bytes` (None: a size that overflows) could not be allocated.
    OutOfMemory { bytes: Option<usize> },
    /// A run was given the wrong number of inputs or outputs.
    Arity {
        what: &'static str,
        expected: usize,
        given: usize,
    },
    /// Input or output `index` (by ascending external id) has another dtype than the graph's.
    DtypeMismatch {
        what: &'static str,
        index: usize,
        expected: DType,
        given: DType,
    },
    /// Input `index` has a shape outside the declared one (another rank, or a larger
    /// dimension).
    ShapeOutOfBounds {
        index: usize,
        shapes: Box<ShapeMismatch>,
    },
    /// Input or output `index` has fewer bytes than its shape needs (`needed` None: the size
    /// overflows).
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

impl fmt::Display for XnnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XnnError::Call { call, status } => write!(f, "XNNPACK {call} failed: {status:?}"),
            XnnError::ExternalSize {
                id,
                expected_elements,
                given_elements,
            } => write!(
                f,
                "external value {id}: buffer holds {given_elements} elements, the runtime expects {expected_elements}"
            ),
            XnnError::StaticDataSize {
                datatype,
                expected_bytes,
                given_bytes,
            } => write!(
                f,
                "static {datatype:?} data holds {given_bytes} bytes, its shape needs {expected_bytes}"
            ),
            XnnError::StaticDataAlignment {
                datatype,
                alignment,
            } => write!(
                f,
                "static {datatype:?} data is not aligned to {alignment} bytes"
            ),
            XnnError::QuantizationScales { expected, given } => write!(
                f,
                "quantized tensor given {given} scales, its shape needs {expected}"
            ),
            XnnError::MissingExternal { id } => write!(f, "external value {id} is not bound"),
            XnnError::UnknownExternal { id } => {
                write!(f, "external value {id} is not an unbound input or output of this runtime")
            }
            XnnError::UnsupportedExternal { id, datatype } => write!(
                f,
                "external value {id} is {datatype:?}, which no buffer can be bound to"
            ),
            XnnError::OutOfMemory { bytes: Some(n) } => write!(f, "could not allocate {n} bytes"),
            XnnError::OutOfMemory { bytes: None } => f.write_str("a buffer size overflows"),
            XnnError::Arity {
                what,
                expected,
                given,
            } => write!(f, "{given} {what} given, the graph has {expected}"),
            XnnError::DtypeMismatch {
                what,
                index,
                expected,
                given,
            } => write!(f, "{what} {index} is {given}, the graph takes {expected}"),
            XnnError::ShapeOutOfBounds { index, shapes } => write!(
                f,
                "input {index} has shape {}, outside the declared bound {} \
                 (same rank, each dimension at most the bound's)",
                shapes.given, shapes.bound
            ),
            XnnError::BufferTooSmall {
                what,
                index,
                needed: Some(needed),
                given,
            } => write!(f, "{what} {index} holds {given} bytes, its shape needs {needed}"),
            XnnError::BufferTooSmall {
                what, index, given, ..
            } => write!(
                f,
                "{what} {index} holds {given} bytes; the size its shape needs overflows"
            ),
        }
    }
}

impl std::error::Error for XnnError {}

/// Turns a raw status of `call` into a `Result`.
pub(crate) fn check(call: &'static str, raw: sys::xnn_status) -> Result<(), XnnError> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => Err(XnnError::Call { call, status }),
    }
}
