//! The `.ptd` (ExecuTorch FlatTensor) byte layout, as `docs/ptd-format.md` describes it.
//!
//! ```text
//! 0      4      8      12     16               24               32               40               48
//! | root | FT01 | FH01 | len  | flatbuffer_off  | flatbuffer_size | segment_base    | segment_size    |
//! [0, flatbuffer_off + flatbuffer_size): the flatbuffer (root offset counts the spliced header)
//! [segment_base, segment_base + segment_size): the segments, each at segment_base + its offset
//! ```

use super::bytes::{end_of, tag_at, u32_at, u64_at, verifier_error};
use super::error::FormatError;
use super::index::NamedDataIndex;
use super::layout::{ScalarType, TensorLayout};
use crate::schema::ptd as fb;
use crate::schema::verifier_options;

/// The flatbuffer file identifier of a `.ptd`, at bytes 4..8.
pub const FILE_IDENTIFIER: [u8; 4] = *b"FT01";
/// The magic the header starts with, at bytes 8..12.
pub const HEADER_MAGIC: [u8; 4] = *b"FH01";

const IDENTIFIER_AT: usize = 4;
pub(crate) const HEADER_AT: usize = IDENTIFIER_AT + 4;
const LENGTH_AT: usize = HEADER_AT + 4;
const FLATBUFFER_OFFSET_AT: usize = LENGTH_AT + 4;
const FLATBUFFER_SIZE_AT: usize = FLATBUFFER_OFFSET_AT + 8;
const SEGMENT_BASE_AT: usize = FLATBUFFER_SIZE_AT + 8;
const SEGMENT_SIZE_AT: usize = SEGMENT_BASE_AT + 8;
const HEADER_END: usize = SEGMENT_SIZE_AT + 8;

/// The header length this version writes; longer headers are read, shorter ones rejected.
pub const HEADER_LENGTH: u32 = (HEADER_END - HEADER_AT) as u32;
/// Segments (and the segment base) are aligned to this, or to a larger requested alignment.
pub const SEGMENT_ALIGNMENT: usize = 128;

/// The fields of the `FH01` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtdHeader {
    /// The header's length in bytes, counted from the magic (40 here; longer is accepted).
    pub length: u32,
    /// The file offset in bytes where the flatbuffer resumes after the header (48 as written).
    pub flatbuffer_offset: u64,
    /// The flatbuffer's bytes from `flatbuffer_offset` on: the flatbuffer ends at their sum.
    pub flatbuffer_size: u64,
    /// The file offset in bytes where the segment data starts; segment offsets count from it.
    pub segment_base_offset: u64,
    /// The size in bytes of the segment data.
    pub segment_data_size: u64,
}

impl PtdHeader {
    /// The header's bytes as written at offset 8 (magic first).
    pub(crate) fn encode(&self) -> [u8; HEADER_END - HEADER_AT] {
        let mut out = [0u8; HEADER_END - HEADER_AT];
        let put = |out: &mut [u8], at: usize, b: &[u8]| {
            out[at - HEADER_AT..at - HEADER_AT + b.len()].copy_from_slice(b)
        };
        put(&mut out, HEADER_AT, &HEADER_MAGIC);
        put(&mut out, LENGTH_AT, &HEADER_LENGTH.to_le_bytes());
        put(
            &mut out,
            FLATBUFFER_OFFSET_AT,
            &self.flatbuffer_offset.to_le_bytes(),
        );
        put(
            &mut out,
            FLATBUFFER_SIZE_AT,
            &self.flatbuffer_size.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_BASE_AT,
            &self.segment_base_offset.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_SIZE_AT,
            &self.segment_data_size.to_le_bytes(),
        );
        out
    }
}

/// Reads and checks the header against the file length.
pub fn parse_header(bytes: &[u8]) -> Result<PtdHeader, FormatError> {
    let len = bytes.len() as u64;
    let identifier = tag_at(bytes, IDENTIFIER_AT, "file identifier")?;
    if identifier != FILE_IDENTIFIER {
        return Err(FormatError::WrongIdentifier {
            expected: FILE_IDENTIFIER,
            found: identifier,
        });
    }
    let magic = tag_at(bytes, HEADER_AT, "FH01 header")?;
    if magic != HEADER_MAGIC {
        return Err(FormatError::WrongHeaderMagic {
            expected: HEADER_MAGIC,
            found: magic,
        });
    }
    let length = u32_at(bytes, LENGTH_AT, "FH01 header")?;
    if length < HEADER_LENGTH {
        return Err(FormatError::HeaderTooShort {
            length,
            min: HEADER_LENGTH,
        });
    }
    let header_end = end_of(HEADER_AT as u64, u64::from(length), "header")?;
    if header_end > len {
        return Err(FormatError::Truncated {
            what: "FH01 header",
            needed: header_end,
            len,
        });
    }
    let header = PtdHeader {
        length,
        flatbuffer_offset: u64_at(bytes, FLATBUFFER_OFFSET_AT, "FH01 header")?,
        flatbuffer_size: u64_at(bytes, FLATBUFFER_SIZE_AT, "FH01 header")?,
        segment_base_offset: u64_at(bytes, SEGMENT_BASE_AT, "FH01 header")?,
        segment_data_size: u64_at(bytes, SEGMENT_SIZE_AT, "FH01 header")?,
    };
    let fb_end = end_of(
        header.flatbuffer_offset,
        header.flatbuffer_size,
        "flatbuffer",
    )?;
    if header.flatbuffer_offset < header_end || fb_end > len {
        return Err(FormatError::RegionOutOfBounds {
            what: "flatbuffer",
            start: header.flatbuffer_offset,
            end: fb_end,
            len,
        });
    }
    let seg_end = end_of(
        header.segment_base_offset,
        header.segment_data_size,
        "segment data",
    )?;
    // An empty segment region may sit at an aligned base past the end of the file.
    if header.segment_data_size > 0 && (header.segment_base_offset < fb_end || seg_end > len) {
        return Err(FormatError::RegionOutOfBounds {
            what: "segment data",
            start: header.segment_base_offset,
            end: seg_end,
            len,
        });
    }
    Ok(header)
}

/// Parses and validates a whole `.ptd` file: header, flatbuffer (verifier), every segment's
/// bounds, every key (present, UTF-8, unique, pointing at an existing segment) and layout.
pub fn parse(bytes: &[u8]) -> Result<NamedDataIndex, FormatError> {
    let header = parse_header(bytes)?;
    let fb_end = (header.flatbuffer_offset + header.flatbuffer_size) as usize;
    let flat_tensor =
        flatbuffers::root_with_opts::<fb::FlatTensor>(&verifier_options(), &bytes[..fb_end])
            .map_err(verifier_error)?;

    // An empty segment region may start past the end of the file (see `parse_header`), and so
    // would its (empty) segments: they are put at the end instead, so that every entry's bytes
    // lie inside the file (found by fuzzing: `get_data` panicked on such an entry).
    let base = header.segment_base_offset.min(bytes.len() as u64);
    let mut segments = Vec::new();
    for (index, seg) in flat_tensor.segments().iter().flatten().enumerate() {
        let end = end_of(seg.offset(), seg.size(), "segment")?;
        if end > header.segment_data_size {
            return Err(FormatError::SegmentOutOfBounds {
                index,
                offset: seg.offset(),
                size: seg.size(),
                data_size: header.segment_data_size,
            });
        }
        // In bounds of the file (checked with the header), so these fit in usize.
        segments.push(((base + seg.offset()) as usize, seg.size() as usize));
    }

    let mut index = NamedDataIndex::new(segments);
    for (entry, named) in flat_tensor.named_data().iter().flatten().enumerate() {
        let key = named.key().ok_or(FormatError::MissingKey { entry })?;
        let layout = match named.tensor_layout() {
            None => None,
            Some(l) => Some(
                TensorLayout::new(
                    ScalarType::from_code(l.scalar_type()),
                    l.sizes().map(|v| v.iter().collect()).unwrap_or_default(),
                    l.dim_order()
                        .map(|v| v.bytes().to_vec())
                        .unwrap_or_default(),
                )
                .map_err(|reason| FormatError::BadLayout {
                    key: key.to_string(),
                    reason,
                })?,
            ),
        };
        index.push(key, named.segment_index(), layout)?;
    }
    Ok(index)
}
