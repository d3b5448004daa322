//! Bounds-checked little-endian reads and flatbuffer verification shared by the parsers.

use super::error::FormatError;

pub(crate) fn u32_at(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, FormatError> {
    let b = bytes.get(at..at + 4).ok_or(FormatError::Truncated {
        what,
        needed: (at + 4) as u64,
        len: bytes.len() as u64,
    })?;
    Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

pub(crate) fn u64_at(bytes: &[u8], at: usize, what: &'static str) -> Result<u64, FormatError> {
    let b = bytes.get(at..at + 8).ok_or(FormatError::Truncated {
        what,
        needed: (at + 8) as u64,
        len: bytes.len() as u64,
    })?;
    Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

pub(crate) fn tag_at(bytes: &[u8], at: usize, what: &'static str) -> Result<[u8; 4], FormatError> {
    let b = bytes.get(at..at + 4).ok_or(FormatError::Truncated {
        what,
        needed: (at + 4) as u64,
        len: bytes.len() as u64,
    })?;
    Ok(b.try_into().expect("4 bytes"))
}

/// `start + size` as a range end, refusing overflow.
pub(crate) fn end_of(start: u64, size: u64, what: &'static str) -> Result<u64, FormatError> {
    start
        .checked_add(size)
        .ok_or(FormatError::Overflow { what })
}

/// Verifier limits: generous for real programs (thousands of keys), bounded for hostile input.
pub(crate) fn verifier_options() -> flatbuffers::VerifierOptions {
    flatbuffers::VerifierOptions {
        max_depth: 64,
        max_tables: 10_000_000,
        max_apparent_size: 1 << 31,
        ignore_missing_null_terminator: false,
    }
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
