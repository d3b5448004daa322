//! Zero-copy views of named data that keep their backing memory alive.

use std::fmt;
use std::sync::Arc;

/// Memory that named data can be borrowed from: a mapped file, an aligned heap buffer, ...
pub trait Backing: Send + Sync {
    /// The whole memory. Buffers keep offsets into it, so every call must return the same bytes.
    fn bytes(&self) -> &[u8];

    /// Drops the resident pages of `[offset, offset + len)` if they can be read back unchanged
    /// later (file-backed memory); a no-op otherwise.
    fn release_pages(&self, _offset: usize, _len: usize) {}

    /// Starts reading `[offset, offset + len)` in, and only that, if it comes from a file by
    /// page faults (file-backed memory); a no-op otherwise.
    fn read_soon(&self, _offset: usize, _len: usize) {}
}

impl Backing for crate::mmap::MappedFile {
    fn bytes(&self) -> &[u8] {
        crate::mmap::MappedFile::bytes(self)
    }

    fn read_soon(&self, offset: usize, len: usize) {
        if let Some(bytes) = self.bytes().get(offset..offset.saturating_add(len)) {
            crate::mmap::advise_read_soon(bytes);
        }
    }

    fn release_pages(&self, offset: usize, len: usize) {
        crate::mmap::MappedFile::release_pages(self, offset, len)
    }
}

impl Backing for crate::aligned::AlignedBytes {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// The bytes of one key, borrowed from the map's backing (no copy). Holding a `DataBuffer`
/// keeps the backing alive even if the map is dropped; dropping it, or calling
/// [`DataBuffer::free`], releases that hold.
#[derive(Clone)]
pub struct DataBuffer {
    backing: Option<Arc<dyn Backing>>,
    offset: usize,
    len: usize,
}

impl DataBuffer {
    /// A view of `len` bytes at `offset` of `backing`; None if that range is not inside it.
    pub fn new(backing: Arc<dyn Backing>, offset: usize, len: usize) -> Option<DataBuffer> {
        let end = offset.checked_add(len)?;
        if end > backing.bytes().len() {
            return None;
        }
        Some(DataBuffer {
            backing: Some(backing),
            offset,
            len,
        })
    }

    /// The bytes of the view; empty once freed.
    pub fn data(&self) -> &[u8] {
        match &self.backing {
            Some(b) => &b.bytes()[self.offset..self.offset + self.len],
            None => &[],
        }
    }

    /// The number of bytes in the view; 0 once freed.
    pub fn len(&self) -> usize {
        self.data().len()
    }

    /// A view of `len` bytes at `offset` within this buffer, sharing its backing.
    pub fn slice(&self, offset: usize, len: usize) -> Option<DataBuffer> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        DataBuffer::new(self.backing.clone()?, self.offset + offset, len)
    }

    /// How many readable bytes the backing has after this buffer's end (XNNPACK may read a few
    /// bytes past the end of the data it is given).
    pub fn slack_after(&self) -> usize {
        self.backing
            .as_ref()
            .map_or(0, |b| b.bytes().len() - (self.offset + self.len))
    }

    /// Whether the view has no bytes (also true once freed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets the OS drop this data's resident pages when they can be read back unchanged (a
    /// mapped file): used once weights are packed, so unpacked and packed copies do not both
    /// stay resident. The data stays readable.
    pub fn release_pages(&self) {
        if let Some(b) = &self.backing {
            b.release_pages(self.offset, self.len);
        }
    }

    /// Starts reading this data's pages in, and only those, when it is a mapped file's: for data
    /// read at every launch, so a fault does not read the device's whole readahead window
    /// around a few KiB. A no-op for memory that is not file-backed.
    pub fn read_soon(&self) {
        if let Some(b) = &self.backing {
            b.read_soon(self.offset, self.len);
        }
    }

    /// Releases the hold on the backing early; the buffer is empty afterwards.
    pub fn free(&mut self) {
        self.backing = None;
        self.len = 0;
    }

    /// Whether [`free`](Self::free) has released the hold on the backing.
    pub fn is_freed(&self) -> bool {
        self.backing.is_none()
    }
}

impl std::ops::Deref for DataBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data()
    }
}

impl AsRef<[u8]> for DataBuffer {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

impl fmt::Debug for DataBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataBuffer")
            .field("len", &self.len)
            .field("freed", &self.is_freed())
            .finish()
    }
}
