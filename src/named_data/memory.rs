//! A named-data map built in memory: for tests, and for blobs made at run time.

use super::NamedDataMap;
use super::buffer::DataBuffer;
use super::error::NamedDataError;
use super::layout::TensorLayout;
use crate::aligned::AlignedBytes;
use std::collections::HashMap;
use std::sync::Arc;

struct Entry {
    key: String,
    bytes: Arc<AlignedBytes>,
    layout: Option<TensorLayout>,
}

/// Blobs held in aligned heap memory, each shared with the buffers handed out.
pub struct InMemoryMap {
    source: String,
    entries: Vec<Entry>,
    by_key: HashMap<String, usize>,
}

impl InMemoryMap {
    /// An empty map; `source` names it in error messages.
    pub fn new(source: impl Into<String>) -> InMemoryMap {
        InMemoryMap {
            source: source.into(),
            entries: Vec::new(),
            by_key: HashMap::new(),
        }
    }

    /// Adds a copy of `bytes` under `key`, aligned to `alignment` (a power of two; at least 16,
    /// as XNNPACK's loads want).
    pub fn insert(
        &mut self,
        key: &str,
        bytes: &[u8],
        alignment: usize,
        layout: Option<TensorLayout>,
    ) -> Result<(), NamedDataError> {
        if self.by_key.contains_key(key) {
            return Err(NamedDataError::DuplicateKey {
                key: key.to_string(),
                map: self.source.clone(),
            });
        }
        if !alignment.is_power_of_two() {
            return Err(NamedDataError::BadAlignment {
                key: key.to_string(),
                alignment,
            });
        }
        let copy = AlignedBytes::copy_from(bytes, alignment.max(16)).ok_or_else(|| {
            NamedDataError::Io {
                map: self.source.clone(),
                error: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            }
        })?;
        self.by_key.insert(key.to_string(), self.entries.len());
        self.entries.push(Entry {
            key: key.to_string(),
            bytes: Arc::new(copy),
            layout,
        });
        Ok(())
    }

    fn entry(&self, key: &str) -> Result<&Entry, NamedDataError> {
        self.by_key
            .get(key)
            .map(|&i| &self.entries[i])
            .ok_or_else(|| NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.source.clone(),
            })
    }
}

impl NamedDataMap for InMemoryMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        let e = self.entry(key)?;
        let len = e.bytes.len();
        Ok(DataBuffer::new(e.bytes.clone(), 0, len).expect("whole buffer"))
    }

    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        Ok(self.entry(key)?.bytes.len())
    }

    fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        Ok(self.entry(key)?.layout.clone())
    }

    fn lists(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    fn num_keys(&self) -> usize {
        self.entries.len()
    }

    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        self.entries
            .get(index)
            .map(|e| e.key.as_str())
            .ok_or(NamedDataError::IndexOutOfRange {
                index,
                len: self.entries.len(),
            })
    }

    fn name(&self) -> &str {
        &self.source
    }
}
