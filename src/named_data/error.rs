//! Errors of named data: reading files, looking keys up, merging maps, writing `.ptd` files.

use std::fmt;
use std::io;

/// Why the bytes of a `.ptd` or `.pte` file were rejected. Each check has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The file ends before a structure it must contain.
    #[error("truncated: {what} needs {needed} bytes, the file has {len}")]
    Truncated {
        what: &'static str,
        needed: u64,
        len: u64,
    },
    /// Bytes 4..8 name neither a `.ptd` (`FT01`) nor a `.pte` (`ET12`).
    #[error(
        "not a .ptd (FT01) or .pte (ET12) file: identifier {:?}",
        String::from_utf8_lossy(.found)
    )]
    UnknownFormat { found: [u8; 4] },
    /// Bytes 4..8 are not the format's flatbuffer file identifier.
    #[error(
        "wrong file identifier {:?}, expected {:?}",
        String::from_utf8_lossy(.found),
        String::from_utf8_lossy(.expected)
    )]
    WrongIdentifier { expected: [u8; 4], found: [u8; 4] },
    /// The header does not start with its magic.
    #[error(
        "wrong header magic {:?}, expected {:?}",
        String::from_utf8_lossy(.found),
        String::from_utf8_lossy(.expected)
    )]
    WrongHeaderMagic { expected: [u8; 4], found: [u8; 4] },
    /// The header declares a length below the minimum of its version.
    #[error("header length {length} is below the minimum {min}")]
    HeaderTooShort { length: u32, min: u32 },
    /// A region the header declares lies (partly) outside the file or overlaps the header.
    #[error("{what} [{start}, {end}) lies outside the file ({len} bytes) or overlaps the header")]
    RegionOutOfBounds {
        what: &'static str,
        start: u64,
        end: u64,
        len: u64,
    },
    /// An offset plus a size does not fit in 64 bits.
    #[error("{what}: offset + size overflows")]
    Overflow { what: &'static str },
    /// The flatbuffer failed the flatbuffers verifier.
    #[error("flatbuffer failed verification: {0}")]
    Verifier(String),
    /// The program has non-empty segments but no extended header saying where they start.
    #[error("the program lists segments but has no extended header")]
    SegmentsWithoutHeader,
    /// A segment lies outside the segment data region.
    #[error("segment {index} [{offset}, +{size}) lies outside the {data_size}-byte segment data")]
    SegmentOutOfBounds {
        index: usize,
        offset: u64,
        size: u64,
        data_size: u64,
    },
    /// A named entry has no key.
    #[error("named data entry {entry} has no key")]
    MissingKey { entry: usize },
    /// A key is not valid UTF-8.
    #[error("named data entry {entry}: key is not valid UTF-8")]
    KeyNotUtf8 { entry: usize },
    /// Two entries share a key.
    #[error("key {key:?} appears twice")]
    DuplicateKey { key: String },
    /// A named entry refers to a segment that does not exist.
    #[error("key {key:?} refers to segment {index}, but there are {segments} segments")]
    SegmentIndexOutOfRange {
        key: String,
        index: u32,
        segments: usize,
    },
    /// A tensor layout is malformed (negative size, dim order not a permutation, ...).
    #[error("key {key:?}: bad tensor layout: {reason}")]
    BadLayout { key: String, reason: String },
    /// A tensor layout needs more bytes than its segment holds.
    #[error(
        "key {key:?}: tensor layout needs {layout_bytes} bytes, its segment holds {segment_size}"
    )]
    LayoutLargerThanSegment {
        key: String,
        layout_bytes: u64,
        segment_size: u64,
    },
}

/// An error of the named-data API. `source` names the map (usually its file path).
#[derive(Debug)]
pub enum NamedDataError {
    /// The file could not be read.
    Io { source: String, error: io::Error },
    /// The file's bytes were rejected.
    Format { source: String, error: FormatError },
    /// No entry has this key.
    KeyNotFound { key: String, source: String },
    /// `key_at` beyond `num_keys`.
    IndexOutOfRange { index: usize, len: usize },
    /// `load_data_into` with a buffer of the wrong size.
    SizeMismatch {
        key: String,
        data_size: usize,
        buffer_size: usize,
    },
    /// `key` was inserted into one map twice.
    DuplicateKey { key: String, source: String },
    /// Alignment must be a non-zero power of two.
    BadAlignment { key: String, alignment: usize },
    /// A map implemented outside Rust (a C++ `NamedDataMap`) reported an error.
    Backend { source: String, message: String },
    /// Two merged maps both have `key`.
    DuplicateKeyAcrossMaps {
        key: String,
        first: String,
        second: String,
    },
}

// Written by hand, not derived with `thiserror`: it takes any field named `source` as the
// error's source, and here `source` is the map's name.
impl fmt::Display for NamedDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use NamedDataError::*;
        match self {
            Io { source, error } => write!(f, "{source}: {error}"),
            Format { source, error } => write!(f, "{source}: {error}"),
            KeyNotFound { key, source } => write!(f, "key {key:?} not found in {source}"),
            IndexOutOfRange { index, len } => {
                write!(f, "key index {index} out of range (the map has {len} keys)")
            }
            SizeMismatch {
                key,
                data_size,
                buffer_size,
            } => write!(
                f,
                "key {key:?} holds {data_size} bytes, the buffer has {buffer_size}"
            ),
            DuplicateKey { key, source } => write!(f, "key {key:?} is already in {source}"),
            BadAlignment { key, alignment } => write!(
                f,
                "key {key:?}: alignment {alignment} is not a power of two"
            ),
            Backend { source, message } => write!(f, "{source}: {message}"),
            DuplicateKeyAcrossMaps { key, first, second } => {
                write!(f, "key {key:?} is in both {first} and {second}")
            }
        }
    }
}

impl std::error::Error for NamedDataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NamedDataError::Io { error, .. } => Some(error),
            NamedDataError::Format { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// An error of [`super::NamedBlobStore`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Alignment must be a non-zero power of two.
    #[error("key {key:?}: alignment {alignment} is not a power of two")]
    BadAlignment { key: String, alignment: usize },
    /// The key was added before with other bytes, another tag or another layout.
    #[error("key {key:?} was already added with {reason}")]
    KeyConflict { key: String, reason: &'static str },
    /// A layout needs more bytes than the blob has.
    #[error("key {key:?}: layout needs {layout_bytes} bytes, the blob has {data_bytes}")]
    LayoutLargerThanData {
        key: String,
        layout_bytes: usize,
        data_bytes: usize,
    },
    /// No blob carries this external tag.
    #[error("no blob has external tag {tag:?}")]
    UnknownTag { tag: String },
    /// A tag must be usable as a file name.
    #[error("external tag {tag:?} cannot name a file (empty, '/', or '.'/'..')")]
    BadTag { tag: String },
    /// Writing a file failed.
    #[error("{path}: {error}")]
    Io {
        path: String,
        #[source]
        error: io::Error,
    },
}
