//! A `NamedDataMap` over a validated file: a `.ptd` or a program's named data.

use super::buffer::{Backing, DataBuffer};
use super::error::{FormatError, NamedDataError};
use super::index::{IndexEntry, NamedDataIndex};
use super::layout::TensorLayout;
use super::{NamedDataMap, ptd_format, pte_format};
use crate::aligned::AlignedBytes;
use crate::mmap::MappedFile;
use std::path::Path;
use std::sync::Arc;

/// Which format a file map was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// ExecuTorch external data (FlatTensor, `FT01`).
    Ptd,
    /// An ExecuTorch program's named data (`ET12`).
    Pte,
}

impl FileKind {
    /// The kind a file's identifier (bytes 4..8) says it is.
    pub fn sniff(bytes: &[u8]) -> Option<FileKind> {
        match bytes.get(4..8)? {
            id if id == ptd_format::FILE_IDENTIFIER => Some(FileKind::Ptd),
            id if id == pte_format::FILE_IDENTIFIER => Some(FileKind::Pte),
            _ => None,
        }
    }

    fn parse(self, bytes: &[u8]) -> Result<NamedDataIndex, FormatError> {
        match self {
            FileKind::Ptd => ptd_format::parse(bytes),
            FileKind::Pte => pte_format::parse(bytes),
        }
    }
}

/// Named data read from a file's bytes, zero-copy. The only way to build one validates the
/// whole index first; lookups are by hash.
pub struct FileDataMap {
    kind: FileKind,
    source: String,
    backing: Arc<dyn Backing>,
    index: NamedDataIndex,
    /// The mapped file's, for a map opened from a path.
    identity: Option<crate::mmap::FileIdentity>,
}

impl FileDataMap {
    /// Maps and validates a `.ptd` file.
    pub fn open_ptd(path: impl AsRef<Path>) -> Result<FileDataMap, NamedDataError> {
        FileDataMap::open_as(path.as_ref(), Some(FileKind::Ptd))
    }

    /// Maps a `.pte` program and validates its named data.
    pub fn open_pte(path: impl AsRef<Path>) -> Result<FileDataMap, NamedDataError> {
        FileDataMap::open_as(path.as_ref(), Some(FileKind::Pte))
    }

    /// Maps a file and reads it as whichever format its identifier names.
    pub fn open(path: impl AsRef<Path>) -> Result<FileDataMap, NamedDataError> {
        FileDataMap::open_as(path.as_ref(), None)
    }

    fn open_as(path: &Path, kind: Option<FileKind>) -> Result<FileDataMap, NamedDataError> {
        let source = path.display().to_string();
        let mapped = MappedFile::open(path).map_err(|error| NamedDataError::Io {
            map: source.clone(),
            error,
        })?;
        let identity = mapped.identity();
        let mut map = FileDataMap::from_backing(Arc::new(mapped), kind, source)?;
        map.identity = Some(identity);
        Ok(map)
    }

    /// Validates bytes already in memory (copied once into an aligned buffer so that
    /// alignment in the file is alignment in memory).
    pub fn from_bytes(
        bytes: &[u8],
        kind: Option<FileKind>,
        source: impl Into<String>,
    ) -> Result<FileDataMap, NamedDataError> {
        let aligned = AlignedBytes::copy_from(bytes, 4096).ok_or_else(|| NamedDataError::Io {
            map: "memory".into(),
            error: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })?;
        FileDataMap::from_backing(Arc::new(aligned), kind, source.into())
    }

    fn from_backing(
        backing: Arc<dyn Backing>,
        kind: Option<FileKind>,
        source: String,
    ) -> Result<FileDataMap, NamedDataError> {
        let bytes = backing.bytes();
        let kind = match kind.or_else(|| FileKind::sniff(bytes)) {
            Some(kind) => kind,
            None => {
                let error = match bytes.get(4..8) {
                    None => FormatError::Truncated {
                        what: "file identifier",
                        needed: 8,
                        len: bytes.len() as u64,
                    },
                    Some(found) => FormatError::UnknownFormat {
                        found: found.try_into().expect("4 bytes"),
                    },
                };
                return Err(NamedDataError::Format { map: source, error });
            }
        };
        let index = kind.parse(bytes).map_err(|error| NamedDataError::Format {
            map: source.clone(),
            error,
        })?;
        Ok(FileDataMap {
            kind,
            source,
            backing,
            index,
            identity: None,
        })
    }

    /// The whole file's bytes, zero-copy (for readers of other parts of the file, such as a
    /// program's execution plans and delegate payloads).
    pub fn file_buffer(&self) -> DataBuffer {
        let len = self.backing.bytes().len();
        DataBuffer::new(self.backing.clone(), 0, len).expect("the whole backing")
    }

    /// The whole file's bytes, borrowed from the map.
    pub fn file_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// The format the file was read as.
    pub fn kind(&self) -> FileKind {
        self.kind
    }

    /// Every key with its segment, absolute file offset, size and layout, in file order.
    pub fn entries(&self) -> &[IndexEntry] {
        self.index.entries()
    }

    /// Absolute (offset, size) of every segment.
    pub fn segments(&self) -> &[(usize, usize)] {
        self.index.segments()
    }

    fn entry(&self, key: &str) -> Result<&IndexEntry, NamedDataError> {
        self.index
            .get(key)
            .ok_or_else(|| NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.source.clone(),
            })
    }
}

impl NamedDataMap for FileDataMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        let e = self.entry(key)?;
        Ok(DataBuffer::new(self.backing.clone(), e.offset, e.size)
            .expect("validated index entries lie inside the backing"))
    }

    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        Ok(self.entry(key)?.size)
    }

    fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        Ok(self.entry(key)?.layout.clone())
    }

    fn num_keys(&self) -> usize {
        self.index.entries().len()
    }

    fn lists(&self, key: &str) -> bool {
        self.index.get(key).is_some()
    }

    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        self.index
            .entries()
            .get(index)
            .map(|e| e.key.as_str())
            .ok_or(NamedDataError::IndexOutOfRange {
                index,
                len: self.num_keys(),
            })
    }

    fn name(&self) -> &str {
        &self.source
    }

    fn file_identity(&self, key: &str) -> Option<crate::mmap::FileIdentity> {
        self.entry(key).ok()?;
        self.identity
    }
}
