//! ExecuTorch's XNNPACK delegate payload (the "processed" blob): an `XH00` header, an `XN01`
//! flatbuffer graph, and optional inline constant data. Pure parsing over bytes.
//!
//! ```text
//! 0    4      8       10        14          18            22          30
//! | -- | XH00 | u16 len | u32 fb_off | u32 fb_size | u32 const_off | u64 const_size |
//! [fb_off, fb_off + fb_size): the XNNGraph flatbuffer; [const_off, + const_size): constants
//! ```

use super::error::DelegateError;
use crate::schema::xnn as fb;

/// The header's magic, at bytes 4..8 of the payload.
pub const MAGIC: [u8; 4] = *b"XH00";
/// The file identifier of the graph flatbuffer (its bytes 4..8).
pub const FLATBUFFER_IDENTIFIER: &str = "XN01";

const MAGIC_AT: usize = 4;
const LENGTH_AT: usize = MAGIC_AT + 4;
const FB_OFFSET_AT: usize = LENGTH_AT + 2;
const FB_SIZE_AT: usize = FB_OFFSET_AT + 4;
const CONST_OFFSET_AT: usize = FB_SIZE_AT + 4;
const CONST_SIZE_AT: usize = CONST_OFFSET_AT + 4;
/// The header length ExecuTorch writes; longer headers are accepted.
pub const HEADER_LENGTH: usize = CONST_SIZE_AT + 8;
/// Where the flatbuffer starts in payloads xnnblob writes (the header padded to 16).
pub const FLATBUFFER_ALIGNMENT: usize = 16;

/// The `XH00` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadHeader {
    /// The header's length in bytes (at least [`HEADER_LENGTH`]).
    pub length: u16,
    /// Where the graph flatbuffer starts, in bytes from the start of the payload.
    pub flatbuffer_offset: u32,
    /// The graph flatbuffer's length in bytes.
    pub flatbuffer_size: u32,
    /// Where the inline constant data starts, in bytes from the start of the payload.
    pub constant_data_offset: u32,
    /// The inline constant data's length in bytes (0 when every constant is named).
    pub constant_data_size: u64,
}

impl PayloadHeader {
    /// The header's bytes as ExecuTorch lays them out (little-endian, [`MAGIC`] included).
    pub fn encode(&self) -> [u8; HEADER_LENGTH] {
        let mut h = [0u8; HEADER_LENGTH];
        h[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(&MAGIC);
        h[LENGTH_AT..LENGTH_AT + 2].copy_from_slice(&self.length.to_le_bytes());
        h[FB_OFFSET_AT..FB_OFFSET_AT + 4].copy_from_slice(&self.flatbuffer_offset.to_le_bytes());
        h[FB_SIZE_AT..FB_SIZE_AT + 4].copy_from_slice(&self.flatbuffer_size.to_le_bytes());
        h[CONST_OFFSET_AT..CONST_OFFSET_AT + 4]
            .copy_from_slice(&self.constant_data_offset.to_le_bytes());
        h[CONST_SIZE_AT..CONST_SIZE_AT + 8].copy_from_slice(&self.constant_data_size.to_le_bytes());
        h
    }
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], DelegateError> {
    crate::le::array_at(bytes, at).ok_or(DelegateError::PayloadTruncated {
        needed: at as u64 + N as u64,
        len: bytes.len() as u64,
    })
}

/// A validated payload: header checked against its length, flatbuffer verified.
pub struct Payload<'a> {
    /// The header, checked against the payload's length.
    pub header: PayloadHeader,
    /// The verified `XNNGraph` flatbuffer, borrowed from the payload.
    pub graph: fb::XNNGraph<'a>,
    /// The inline constant data region (empty when constants are named).
    pub constant_data: &'a [u8],
}

/// Parses and validates a payload.
pub fn parse(bytes: &[u8]) -> Result<Payload<'_>, DelegateError> {
    let (header, fb_bytes, constant_data) = framed(bytes)?;
    let graph = crate::schema::xnn_graph(fb_bytes).map_err(DelegateError::PayloadVerifier)?;
    Ok(Payload {
        header,
        graph,
        constant_data,
    })
}

/// Each node's type in a payload's graph, with the framing checked as [`parse`] checks it and
/// the flatbuffer only as far as the types are read ([`crate::schema::xnn_node_types`]): a
/// payload whose types this reads may still be one `parse` refuses.
pub(crate) fn node_types(
    bytes: &[u8],
) -> Result<impl Iterator<Item = fb::XNodeUnion> + '_, DelegateError> {
    let (_, fb_bytes, _) = framed(bytes)?;
    crate::schema::xnn_node_types(fb_bytes).map_err(DelegateError::PayloadVerifier)
}

/// The header, checked against the payload's length, the graph's flatbuffer (its identifier
/// checked, nothing else) and the inline constant data.
fn framed(bytes: &[u8]) -> Result<(PayloadHeader, &[u8], &[u8]), DelegateError> {
    let magic: [u8; 4] = field(bytes, MAGIC_AT)?;
    if magic != MAGIC {
        return Err(DelegateError::PayloadMagic { found: magic });
    }
    let header = PayloadHeader {
        length: u16::from_le_bytes(field(bytes, LENGTH_AT)?),
        flatbuffer_offset: u32::from_le_bytes(field(bytes, FB_OFFSET_AT)?),
        flatbuffer_size: u32::from_le_bytes(field(bytes, FB_SIZE_AT)?),
        constant_data_offset: u32::from_le_bytes(field(bytes, CONST_OFFSET_AT)?),
        constant_data_size: u64::from_le_bytes(field(bytes, CONST_SIZE_AT)?),
    };
    if usize::from(header.length) < HEADER_LENGTH {
        return Err(DelegateError::PayloadHeader(format!(
            "header length {} is below {HEADER_LENGTH}",
            header.length
        )));
    }
    let len = bytes.len() as u64;
    let fb_start = u64::from(header.flatbuffer_offset);
    let fb_end = fb_start + u64::from(header.flatbuffer_size);
    if fb_start < u64::from(header.length) || fb_end > len {
        return Err(DelegateError::PayloadHeader(format!(
            "flatbuffer [{fb_start}, {fb_end}) lies outside the {len}-byte payload"
        )));
    }
    let const_start = u64::from(header.constant_data_offset);
    let const_end = const_start.checked_add(header.constant_data_size);
    if header.constant_data_size > 0 && const_end.is_none_or(|end| end > len) {
        return Err(DelegateError::PayloadHeader(format!(
            "constant data [{const_start}, +{}) lies outside the {len}-byte payload",
            header.constant_data_size
        )));
    }
    let fb_bytes = &bytes[fb_start as usize..fb_end as usize];
    // The identifier check asserts (panics) on fewer bytes than a root offset and identifier.
    if fb_bytes.len() < 8 || !fb::xnngraph_buffer_has_identifier(fb_bytes) {
        return Err(DelegateError::PayloadIdentifier {
            found: fb_bytes
                .get(4..8.min(fb_bytes.len()))
                .unwrap_or(&[])
                .to_vec(),
        });
    }
    let constant_data = if header.constant_data_size > 0 {
        &bytes[const_start as usize..(const_start + header.constant_data_size) as usize]
    } else {
        &[]
    };
    Ok((header, fb_bytes, constant_data))
}
