//! Why a delegate could not be initialised or run.

use crate::cache::CacheError;
use crate::shared_cache::SharedCacheError;
use crate::xnn::XnnError;
use std::fmt;

/// Why a delegate could not be initialised or run.
#[derive(Debug)]
pub enum DelegateError {
    /// The payload ends before its header does.
    PayloadTruncated { needed: u64, len: u64 },
    /// Bytes 4..8 are not `XH00`.
    PayloadMagic { found: [u8; 4] },
    /// The header's fields do not fit the payload.
    PayloadHeader(String),
    /// The graph flatbuffer is not an `XN01` flatbuffer or fails the verifier.
    PayloadVerifier(String),
    /// A node kind this delegate does not build.
    UnsupportedNode { index: usize, name: String },
    /// A value of a datatype this delegate does not build.
    UnsupportedDatatype { value: usize, datatype: i16 },
    /// A value, node or constant reference that does not make sense.
    BadGraph(String),
    /// A constant's named key is not in the named-data map (or could not be loaded).
    MissingConstant {
        key: String,
        source: SharedCacheError,
    },
    /// A constant left unread (its packing was expected in the cache) is not in the named-data
    /// map, or could not be read when XNNPACK needed it after all.
    UnreadConstant {
        key: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The packed-weight cache failed (I/O).
    Cache(CacheError),
    /// XNNPACK refused a value, a node, or the runtime; `what` says which.
    Xnn { what: String, error: XnnError },
}

impl fmt::Display for DelegateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DelegateError::*;
        match self {
            PayloadTruncated { needed, len } => write!(
                f,
                "XNNPACK payload truncated: {needed} bytes needed, {len} given"
            ),
            PayloadMagic { found } => write!(
                f,
                "not an XNNPACK payload: magic {:?}, expected \"XH00\"",
                String::from_utf8_lossy(found)
            ),
            PayloadHeader(m) => write!(f, "bad XNNPACK payload header: {m}"),
            PayloadVerifier(m) => write!(f, "XNNPACK graph flatbuffer rejected: {m}"),
            UnsupportedNode { index, name } => {
                write!(f, "node {index}: {name} is not supported by this delegate")
            }
            UnsupportedDatatype { value, datatype } => {
                write!(f, "value {value}: datatype {datatype} is not supported")
            }
            BadGraph(m) => write!(f, "bad XNNPACK graph: {m}"),
            MissingConstant { key, source } => {
                write!(f, "constant {key:?} could not be loaded: {source}")
            }
            UnreadConstant { key, source } => {
                write!(f, "constant {key:?} could not be read: {source}")
            }
            Cache(e) => write!(f, "{e}"),
            Xnn { what, error } => write!(f, "{what}: {error}"),
        }
    }
}

impl std::error::Error for DelegateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DelegateError::MissingConstant { source, .. } => Some(source),
            DelegateError::UnreadConstant { source, .. } => Some(&**source),
            DelegateError::Cache(e) => Some(e),
            DelegateError::Xnn { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<XnnError> for DelegateError {
    fn from(error: XnnError) -> Self {
        DelegateError::Xnn {
            what: "XNNPACK".into(),
            error,
        }
    }
}

/// Adds what was being defined to an XNNPACK error.
pub(crate) fn at(what: impl FnOnce() -> String) -> impl FnOnce(XnnError) -> DelegateError {
    move |error| DelegateError::Xnn {
        what: what(),
        error,
    }
}
