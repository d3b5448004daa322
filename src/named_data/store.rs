//! The ahead-of-time writer: blobs under keys, grouped by external tag into `.ptd` files laid
//! out exactly as ExecuTorch's exporter lays them out.

use super::error::StoreError;
use super::layout::TensorLayout;
use super::ptd_format::{HEADER_AT, HEADER_LENGTH, PtdHeader, SEGMENT_ALIGNMENT};
use crate::schema::ptd as fb;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct Blob {
    bytes: Vec<u8>,
    /// The largest alignment any key asked of these bytes.
    alignment: usize,
}

struct Entry {
    key: String,
    blob: usize,
    tag: String,
    layout: Option<TensorLayout>,
}

/// Collects named blobs and writes one `.ptd` per external tag. Identical bytes are stored
/// once, whatever keys they are added under.
#[derive(Default)]
pub struct NamedBlobStore {
    blobs: Vec<Blob>,
    by_content: HashMap<u64, Vec<usize>>,
    entries: Vec<Entry>,
    by_key: HashMap<String, usize>,
}

/// Buckets blobs by content before a byte comparison: the crate's one byte hash.
fn content_hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    CONTENT_HASH.hash_one(bytes)
}

/// Fixed-seeded, so a store dedupes the same way every time it runs.
static CONTENT_HASH: foldhash::quality::FixedState = foldhash::quality::FixedState::with_seed(0);

fn align_up(value: usize, alignment: usize) -> usize {
    value.next_multiple_of(alignment)
}

impl NamedBlobStore {
    /// An empty store.
    pub fn new() -> NamedBlobStore {
        NamedBlobStore::default()
    }

    /// Adds `bytes` under `key` for the file of `external_tag`, aligned to `alignment` (a power
    /// of two) in that file. Adding a key again with the same bytes, tag and layout is a no-op;
    /// with anything different it is an error naming the key.
    pub fn add_named_blob(
        &mut self,
        key: &str,
        bytes: &[u8],
        alignment: usize,
        external_tag: &str,
        layout: Option<TensorLayout>,
    ) -> Result<(), StoreError> {
        if !alignment.is_power_of_two() {
            return Err(StoreError::BadAlignment {
                key: key.to_string(),
                alignment,
            });
        }
        if let Some(nbytes) = layout.as_ref().and_then(TensorLayout::nbytes)
            && nbytes > bytes.len()
        {
            return Err(StoreError::LayoutLargerThanData {
                key: key.to_string(),
                layout_bytes: nbytes,
                data_bytes: bytes.len(),
            });
        }
        if let Some(&i) = self.by_key.get(key) {
            let e = &self.entries[i];
            let conflict = if self.blobs[e.blob].bytes != bytes {
                Some("different bytes")
            } else if e.tag != external_tag {
                Some("a different external tag")
            } else if e.layout != layout {
                Some("a different tensor layout")
            } else {
                None
            };
            if let Some(reason) = conflict {
                return Err(StoreError::KeyConflict {
                    key: key.to_string(),
                    reason,
                });
            }
            let blob = &mut self.blobs[e.blob];
            blob.alignment = blob.alignment.max(alignment);
            return Ok(());
        }
        let hash = content_hash(bytes);
        let same = self
            .by_content
            .get(&hash)
            .and_then(|c| c.iter().copied().find(|&b| self.blobs[b].bytes == bytes));
        let blob = match same {
            Some(b) => {
                self.blobs[b].alignment = self.blobs[b].alignment.max(alignment);
                b
            }
            None => {
                self.blobs.push(Blob {
                    bytes: bytes.to_vec(),
                    alignment,
                });
                self.by_content
                    .entry(hash)
                    .or_default()
                    .push(self.blobs.len() - 1);
                self.blobs.len() - 1
            }
        };
        self.by_key.insert(key.to_string(), self.entries.len());
        self.entries.push(Entry {
            key: key.to_string(),
            blob,
            tag: external_tag.to_string(),
            layout,
        });
        Ok(())
    }

    /// The external tags in first-use order.
    pub fn tags(&self) -> Vec<&str> {
        let mut tags: Vec<&str> = Vec::new();
        for e in &self.entries {
            if !tags.contains(&e.tag.as_str()) {
                tags.push(&e.tag);
            }
        }
        tags
    }

    /// Number of distinct blobs stored (after deduplication).
    pub fn unique_blobs(&self) -> usize {
        self.blobs.len()
    }

    /// The `.ptd` bytes of one tag.
    pub fn serialize(&self, tag: &str) -> Result<Vec<u8>, StoreError> {
        let entries: Vec<&Entry> = self.entries.iter().filter(|e| e.tag == tag).collect();
        if entries.is_empty() {
            return Err(StoreError::UnknownTag {
                tag: tag.to_string(),
            });
        }
        // Segments: the tag's distinct blobs in first-use order, each aligned to
        // lcm(128, requested) (both powers of two: their max).
        let mut segment_of_blob: HashMap<usize, u32> = HashMap::new();
        let mut segments: Vec<(usize, usize)> = Vec::new(); // (blob, relative offset)
        let mut cursor = 0usize;
        let mut base_alignment = SEGMENT_ALIGNMENT;
        for e in &entries {
            if segment_of_blob.contains_key(&e.blob) {
                continue;
            }
            let alignment = self.blobs[e.blob].alignment.max(SEGMENT_ALIGNMENT);
            base_alignment = base_alignment.max(alignment);
            let offset = align_up(cursor, alignment);
            segment_of_blob.insert(e.blob, segments.len() as u32);
            segments.push((e.blob, offset));
            cursor = offset + self.blobs[e.blob].bytes.len();
        }
        let segment_data_size = cursor;

        let mut builder = flatbuffers::FlatBufferBuilder::new();
        let segment_offsets: Vec<_> = segments
            .iter()
            .map(|&(blob, offset)| {
                fb::DataSegment::create(
                    &mut builder,
                    &fb::DataSegmentArgs {
                        offset: offset as u64,
                        size: self.blobs[blob].bytes.len() as u64,
                    },
                )
            })
            .collect();
        let named: Vec<_> = entries
            .iter()
            .map(|e| {
                let key = builder.create_string(&e.key);
                let tensor_layout = e.layout.as_ref().map(|l| {
                    let sizes = builder.create_vector(l.sizes());
                    let dim_order = builder.create_vector(l.dim_order());
                    fb::TensorLayout::create(
                        &mut builder,
                        &fb::TensorLayoutArgs {
                            scalar_type: l.scalar_type().code(),
                            sizes: Some(sizes),
                            dim_order: Some(dim_order),
                        },
                    )
                });
                fb::NamedData::create(
                    &mut builder,
                    &fb::NamedDataArgs {
                        key: Some(key),
                        segment_index: segment_of_blob[&e.blob],
                        tensor_layout,
                    },
                )
            })
            .collect();
        let segments_vec = builder.create_vector(&segment_offsets);
        let named_vec = builder.create_vector(&named);
        let root = fb::FlatTensor::create(
            &mut builder,
            &fb::FlatTensorArgs {
                version: 0,
                segments: Some(segments_vec),
                named_data: Some(named_vec),
            },
        );
        fb::finish_flat_tensor_buffer(&mut builder, root);
        let flatbuffer = builder.finished_data();

        // Splice the header in after the identifier; the root offset moves by its length.
        let header_len = HEADER_LENGTH as usize;
        let flatbuffer_offset = HEADER_AT + header_len;
        let flatbuffer_size = flatbuffer.len() - HEADER_AT;
        let segment_base_offset = align_up(flatbuffer_offset + flatbuffer_size, base_alignment);
        let header = PtdHeader {
            length: HEADER_LENGTH,
            flatbuffer_offset: flatbuffer_offset as u64,
            flatbuffer_size: flatbuffer_size as u64,
            segment_base_offset: segment_base_offset as u64,
            segment_data_size: segment_data_size as u64,
        };
        let root_offset = u32::from_le_bytes(flatbuffer[0..4].try_into().expect("4 bytes"));
        let mut out = Vec::with_capacity(segment_base_offset + segment_data_size);
        out.extend_from_slice(&(root_offset + HEADER_LENGTH).to_le_bytes());
        out.extend_from_slice(&flatbuffer[4..HEADER_AT]);
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&flatbuffer[HEADER_AT..]);
        for &(blob, offset) in &segments {
            out.resize(segment_base_offset + offset, 0);
            out.extend_from_slice(&self.blobs[blob].bytes);
        }
        out.resize(segment_base_offset + segment_data_size, 0);
        Ok(out)
    }

    /// Writes the `.ptd` of `tag` to `path` atomically: a crash leaves either the old file or
    /// the complete new one under `path`, never a part.
    pub fn write_ptd(&self, tag: &str, path: &Path) -> Result<(), StoreError> {
        let bytes = self.serialize(tag)?;
        write_atomically(path, &bytes)
    }

    /// Writes every tag's file as `<dir>/<tag>.ptd`; returns the paths written.
    pub fn write_all(&self, dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
        let mut written = Vec::new();
        for tag in self.tags() {
            if tag.is_empty() || tag == "." || tag == ".." || tag.contains(['/', '\0']) {
                return Err(StoreError::BadTag {
                    tag: tag.to_string(),
                });
            }
            let path = dir.join(format!("{tag}.ptd"));
            self.write_ptd(tag, &path)?;
            written.push(path);
        }
        Ok(written)
    }
}

/// Replaces `path` with `bytes` atomically and durably (`crate::publish`).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    crate::publish::write_atomically(path, bytes).map_err(|error| StoreError::Io {
        path: path.display().to_string(),
        error,
    })
}
