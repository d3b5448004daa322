//! The validated index of a file's named data: what the format parsers produce.

use super::error::FormatError;
use super::layout::TensorLayout;
use crate::fast_hash::FastMap;

/// One key: where its bytes are in the file, and its layout if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// The named-data key this entry answers to.
    pub key: String,
    /// The segment holding the bytes, as an index into the file's segment list.
    pub segment_index: u32,
    /// Absolute offset of the bytes in the file.
    pub offset: usize,
    /// The size of the bytes: the whole segment, as in ExecuTorch (a layout may describe less).
    pub size: usize,
    /// The tensor layout stored with the key; always None in a `.pte`.
    pub layout: Option<TensorLayout>,
}

/// A file's segments and keys, checked: every entry's bytes lie inside the file, keys are
/// unique. Only the parsers can build one.
#[derive(Debug, Clone, Default)]
pub struct NamedDataIndex {
    entries: Vec<IndexEntry>,
    by_key: FastMap<String, usize>,
    /// Absolute (offset, size) of each segment.
    segments: Vec<(usize, usize)>,
}

impl NamedDataIndex {
    pub(crate) fn new(segments: Vec<(usize, usize)>) -> NamedDataIndex {
        NamedDataIndex {
            entries: Vec::new(),
            by_key: FastMap::default(),
            segments,
        }
    }

    /// Adds a key pointing at a segment; the caller has checked the segment's bounds.
    pub(crate) fn push(
        &mut self,
        key: &str,
        segment_index: u32,
        layout: Option<TensorLayout>,
    ) -> Result<(), FormatError> {
        let &(offset, size) = self.segments.get(segment_index as usize).ok_or_else(|| {
            FormatError::SegmentIndexOutOfRange {
                key: key.to_string(),
                index: segment_index,
                segments: self.segments.len(),
            }
        })?;
        if let Some(nbytes) = layout.as_ref().and_then(TensorLayout::nbytes)
            && nbytes > size
        {
            return Err(FormatError::LayoutLargerThanSegment {
                key: key.to_string(),
                layout_bytes: nbytes as u64,
                segment_size: size as u64,
            });
        }
        if self.by_key.contains_key(key) {
            return Err(FormatError::DuplicateKey {
                key: key.to_string(),
            });
        }
        self.by_key.insert(key.to_string(), self.entries.len());
        self.entries.push(IndexEntry {
            key: key.to_string(),
            segment_index,
            offset,
            // As in ExecuTorch, a key's data is its whole segment (a layout may describe less).
            size,
            layout,
        });
        Ok(())
    }

    /// Every entry, in file order.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The entry of `key` (a hash lookup); None if the file has no such key.
    pub fn get(&self, key: &str) -> Option<&IndexEntry> {
        self.by_key.get(key).map(|&i| &self.entries[i])
    }

    /// Absolute (offset, size) in bytes of each segment, in file order.
    pub fn segments(&self) -> &[(usize, usize)] {
        &self.segments
    }
}
