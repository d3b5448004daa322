//! The named-data part of an ExecuTorch program (`.pte`).
//!
//! ```text
//! 0      4      8      12     16              24                 32
//! | root | ET12 | eh00 | len  | program_size  | segment_base     | segment_data_size (len >= 32)
//! [0, program_size): the Program flatbuffer; segments at segment_base + their offset
//! ```
//! Without segments there is no extended header, and the flatbuffer is the whole file.

use super::bytes::{end_of, tag_at, u32_at, u64_at, verifier_error};
use super::error::FormatError;
use super::index::NamedDataIndex;
use crate::schema::pte as fb;
use crate::schema::verifier_options;

/// The flatbuffer file identifier of a program, at bytes 4..8.
pub const FILE_IDENTIFIER: [u8; 4] = *b"ET12";
/// The magic of the extended header, at bytes 8..12; a program without segments has none.
pub const HEADER_MAGIC: [u8; 4] = *b"eh00";

const IDENTIFIER_AT: usize = 4;
const HEADER_AT: usize = IDENTIFIER_AT + 4;
const LENGTH_AT: usize = HEADER_AT + 4;
const PROGRAM_SIZE_AT: usize = LENGTH_AT + 4;
const SEGMENT_BASE_AT: usize = PROGRAM_SIZE_AT + 8;
const SEGMENT_SIZE_AT: usize = SEGMENT_BASE_AT + 8;
const HEADER_END: usize = SEGMENT_SIZE_AT + 8;

/// Headers of older programs stop before segment_data_size.
const MIN_HEADER_LENGTH: u32 = (SEGMENT_SIZE_AT - HEADER_AT) as u32;
/// The header length this version writes (32 bytes from the magic); older, shorter headers
/// are read too.
pub const HEADER_LENGTH: u32 = (HEADER_END - HEADER_AT) as u32;

/// The `eh00` extended header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PteHeader {
    /// The header's length in bytes, counted from the magic (32, or 24 in older programs).
    pub length: u32,
    /// The size in bytes of the program flatbuffer, which starts at offset 0.
    pub program_size: u64,
    /// The file offset in bytes where the segment data starts; segment offsets count from it.
    pub segment_base_offset: u64,
    /// Absent in headers shorter than 32 bytes: the segments then run to the end of the file.
    pub segment_data_size: u64,
}

/// The extended header, if the program has one, checked against the file length.
pub fn parse_header(bytes: &[u8]) -> Result<Option<PteHeader>, FormatError> {
    let len = bytes.len() as u64;
    let identifier = tag_at(bytes, IDENTIFIER_AT, "file identifier")?;
    if identifier != FILE_IDENTIFIER {
        return Err(FormatError::WrongIdentifier {
            expected: FILE_IDENTIFIER,
            found: identifier,
        });
    }
    if bytes.get(HEADER_AT..HEADER_AT + 4) != Some(&HEADER_MAGIC[..]) {
        return Ok(None);
    }
    let length = u32_at(bytes, LENGTH_AT, "eh00 header")?;
    if length < MIN_HEADER_LENGTH {
        return Err(FormatError::HeaderTooShort {
            length,
            min: MIN_HEADER_LENGTH,
        });
    }
    let header_end = end_of(HEADER_AT as u64, u64::from(length), "header")?;
    if header_end > len {
        return Err(FormatError::Truncated {
            what: "eh00 header",
            needed: header_end,
            len,
        });
    }
    let segment_base_offset = u64_at(bytes, SEGMENT_BASE_AT, "eh00 header")?;
    let header = PteHeader {
        length,
        program_size: u64_at(bytes, PROGRAM_SIZE_AT, "eh00 header")?,
        segment_base_offset,
        segment_data_size: if length >= HEADER_LENGTH {
            u64_at(bytes, SEGMENT_SIZE_AT, "eh00 header")?
        } else {
            len.saturating_sub(segment_base_offset)
        },
    };
    if header.program_size < header_end || header.program_size > len {
        return Err(FormatError::RegionOutOfBounds {
            what: "program flatbuffer",
            start: 0,
            end: header.program_size,
            len,
        });
    }
    let data_size = header.segment_data_size;
    let seg_end = end_of(header.segment_base_offset, data_size, "segment data")?;
    if data_size > 0 && (header.segment_base_offset < header.program_size || seg_end > len) {
        return Err(FormatError::RegionOutOfBounds {
            what: "segment data",
            start: header.segment_base_offset,
            end: seg_end,
            len,
        });
    }
    Ok(Some(header))
}

/// Parses a program's named data: header, flatbuffer (verifier), segment bounds, keys.
pub fn parse(bytes: &[u8]) -> Result<NamedDataIndex, FormatError> {
    let header = parse_header(bytes)?;
    let program_end = header.map_or(bytes.len(), |h| h.program_size as usize);
    let program =
        flatbuffers::root_with_opts::<fb::Program>(&verifier_options(), &bytes[..program_end])
            .map_err(verifier_error)?;

    // Without an extended header there is no segment data: only empty segments can exist.
    let (base, data_size) = header.map_or((0, 0), |h| (h.segment_base_offset, h.segment_data_size));
    // As in the .ptd parser: an empty segment region past the end of the file puts its empty
    // segments at the end, so that every entry's bytes lie inside the file.
    let base = base.min(bytes.len() as u64);
    let mut segments = Vec::new();
    for (index, seg) in program.segments().iter().flatten().enumerate() {
        let end = end_of(seg.offset(), seg.size(), "segment")?;
        if header.is_none() && seg.size() > 0 {
            return Err(FormatError::SegmentsWithoutHeader);
        }
        if end > data_size {
            return Err(FormatError::SegmentOutOfBounds {
                index,
                offset: seg.offset(),
                size: seg.size(),
                data_size,
            });
        }
        segments.push(((base + seg.offset()) as usize, seg.size() as usize));
    }

    let mut index = NamedDataIndex::new(segments);
    for (entry, named) in program.named_data().iter().flatten().enumerate() {
        let key = named.key().ok_or(FormatError::MissingKey { entry })?;
        index.push(key, named.segment_index(), None)?;
    }
    Ok(index)
}
