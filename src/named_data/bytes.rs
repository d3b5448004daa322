//! The named-data parsers' header fields (through the crate's one reader, [`crate::le`]) with
//! their error, and the flatbuffer verification they share.

use super::error::FormatError;
use crate::le;

/// What a field `N` bytes long at `at` needs, as the error a read past the end gives.
fn truncated(bytes: &[u8], at: usize, n: usize, what: &'static str) -> FormatError {
    FormatError::Truncated {
        what,
        needed: at as u64 + n as u64,
        len: bytes.len() as u64,
    }
}

pub(crate) fn u32_at(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, FormatError> {
    le::u32_at(bytes, at).ok_or_else(|| truncated(bytes, at, 4, what))
}

pub(crate) fn u64_at(bytes: &[u8], at: usize, what: &'static str) -> Result<u64, FormatError> {
    le::u64_at(bytes, at).ok_or_else(|| truncated(bytes, at, 8, what))
}

pub(crate) fn tag_at(bytes: &[u8], at: usize, what: &'static str) -> Result<[u8; 4], FormatError> {
    le::array_at(bytes, at).ok_or_else(|| truncated(bytes, at, 4, what))
}

/// `start + size` as a range end, refusing overflow.
pub(crate) fn end_of(start: u64, size: u64, what: &'static str) -> Result<u64, FormatError> {
    start
        .checked_add(size)
        .ok_or(FormatError::Overflow { what })
}

/// Maps a verifier failure to a typed error: a string that is not UTF-8 can only be a key in
/// the named-data schemas, so it gets its own variant.
pub(crate) fn verifier_error(e: flatbuffers::InvalidFlatbuffer) -> FormatError {
    if let flatbuffers::InvalidFlatbuffer::Utf8Error { error_trace, .. } = &e {
        let entry = error_trace.as_ref().iter().find_map(|d| match d {
            flatbuffers::ErrorTraceDetail::VectorElement { index, .. } => Some(*index),
            _ => None,
        });
        return FormatError::KeyNotUtf8 {
            entry: entry.unwrap_or(0),
        };
    }
    FormatError::Verifier(e.to_string())
}
