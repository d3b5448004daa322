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

    /// How many bytes past the end of [`bytes`](Self::bytes) can be read without a fault,
    /// although no Rust value owns them: only XNNPACK's over-read of its inputs touches them.
    /// Memory lent by a host that sizes its buffers exactly (ExecuTorch's `FreeableBuffer`)
    /// still has the rest of its last page; 0 when nothing is known.
    fn readable_after(&self) -> usize {
        0
    }
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
        self.backing.as_ref().map_or(0, |b| {
            b.bytes().len() - (self.offset + self.len) + b.readable_after()
        })
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

#[cfg(test)]
mod tests {
    use super::{Backing, DataBuffer};
    use std::sync::Arc;

    /// Bytes that claim `after` more readable bytes past their end, as a host's exactly sized
    /// buffer does.
    struct Lent {
        bytes: Vec<u8>,
        after: usize,
    }

    impl Backing for Lent {
        fn bytes(&self) -> &[u8] {
            &self.bytes
        }

        fn readable_after(&self) -> usize {
            self.after
        }
    }

    #[test]
    fn slack_counts_the_backings_own_bytes_and_what_it_says_is_readable_after_them() {
        let lent = Arc::new(Lent {
            bytes: vec![0; 100],
            after: 12,
        });
        let whole = DataBuffer::new(lent.clone(), 0, 100).unwrap();
        assert_eq!(whole.slack_after(), 12);
        let inner = DataBuffer::new(lent, 10, 80).unwrap();
        assert_eq!(inner.slack_after(), 10 + 12);
        let mut freed = inner.clone();
        freed.free();
        assert_eq!(freed.slack_after(), 0);
    }

    #[test]
    fn the_rest_of_the_last_page_is_readable_unless_the_end_is_on_a_page_boundary() {
        use crate::aligned::readable_in_page_after;
        assert_eq!(readable_in_page_after(4096), 0);
        assert_eq!(readable_in_page_after(4096 + 1), 4095);
        assert_eq!(readable_in_page_after(3 * 4096 - 16), 16);
        assert_eq!(readable_in_page_after(3 * 4096 - 15), 15);
    }
}
