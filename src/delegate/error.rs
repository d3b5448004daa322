//! Why a delegate could not be initialised or run.

use crate::cache::CacheError;
use crate::shared_data::SharedDataError;
use crate::xnn::XnnError;

/// Why a delegate could not be initialised or run.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// The payload ends before its header does.
    #[error("XNNPACK payload truncated: {needed} bytes needed, {len} given")]
    PayloadTruncated {
        /// The bytes the payload needs to hold the header field being read.
        needed: u64,
        /// The payload's actual length, in bytes.
        len: u64,
    },
    /// Bytes 4..8 are not `XH00`.
    #[error(
        "not an XNNPACK payload: magic {:?}, expected \"XH00\"",
        String::from_utf8_lossy(.found)
    )]
    PayloadMagic {
        /// The payload's bytes 4..8.
        found: [u8; 4],
    },
    /// The header's fields do not fit the payload.
    #[error("bad XNNPACK payload header: {0}")]
    PayloadHeader(String),
    /// The graph flatbuffer's identifier (its bytes 4..8) is not `XN01`.
    #[error("not an XNNPACK graph flatbuffer: identifier {:?}, expected \"XN01\"", String::from_utf8_lossy(.found))]
    PayloadIdentifier {
        /// The flatbuffer's bytes 4..8 (fewer where it is shorter).
        found: Vec<u8>,
    },
    /// The graph flatbuffer fails verification against its schema.
    #[error("XNNPACK graph flatbuffer rejected")]
    PayloadVerifier(#[source] crate::schema::verify::VerifyError),
    /// A node kind this delegate does not build.
    #[error("node {index}: {name} is not supported by this delegate")]
    UnsupportedNode {
        /// The node's position in the graph's node list.
        index: usize,
        /// The node's schema type (`XNNMaxPooling2d`), or `node type N` for an unknown code.
        name: String,
    },
    /// A value of a datatype this delegate does not build.
    #[error("value {value}: datatype {datatype} is not supported")]
    UnsupportedDatatype {
        /// The value's position in the graph's value list.
        value: usize,
        /// The value's `XNNDatatype` code in the schema.
        datatype: i16,
    },
    /// Memory for `what` could not be allocated.
    #[error("out of memory for {what} ({bytes} bytes)")]
    OutOfMemory {
        /// What the memory was for.
        what: String,
        /// How many bytes were asked for.
        bytes: usize,
    },
    /// A value, node or constant reference that does not make sense.
    #[error("bad XNNPACK graph: {0}")]
    BadGraph(String),
    /// An output the caller binds over an input's memory (a state's write-back) is written
    /// before the graph has read that input completely, or names no such external.
    #[error("output {output} cannot share the memory of input {input}: {why}")]
    Alias {
        /// The input's external id.
        input: u32,
        /// The output's external id.
        output: u32,
        /// What the graph does.
        why: String,
    },
    /// A constant's named key is not in the named-data map (or could not be loaded).
    #[error("constant {key:?} could not be loaded")]
    MissingConstant {
        /// The constant's named-data key, as the payload gives it.
        key: String,
        /// Why the shared data cache could not load it (a missing key is an init failure).
        source: SharedDataError,
    },
    /// A constant left unread (its packing was expected in the cache) is not in the named-data
    /// map, or could not be read when XNNPACK needed it after all.
    #[error("constant {key:?} could not be read")]
    UnreadConstant {
        /// The constant's named-data key, as the payload gives it.
        key: String,
        /// Why its bytes could not be read in.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The packed-weight cache failed (I/O).
    #[error(transparent)]
    Cache(CacheError),
    /// XNNPACK refused a value, a node, or the runtime; `what` says which.
    #[error("{what}")]
    Xnn {
        /// What was being done: `node 3 (XNNConv2d)`, `value 5 (Fp32 [1, 8])`, `execute`, ...
        what: String,
        /// The error XNNPACK, or the safe layer over it, reported.
        #[source]
        error: XnnError,
    },
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
