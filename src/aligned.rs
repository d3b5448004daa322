//! Owned byte buffers with a chosen alignment (a `Vec<u8>` only promises 1).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// A zero-initialised heap buffer whose start is aligned to a power of two.
pub struct AlignedBytes {
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
}

// SAFETY: AlignedBytes exclusively owns its allocation, like a Box<[u8]>.
unsafe impl Send for AlignedBytes {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// `len` zero bytes aligned to `align`; None if `align` is not a power of two or the
    /// allocation fails.
    pub fn zeroed(len: usize, align: usize) -> Option<AlignedBytes> {
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: the layout's size is non-zero.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(AlignedBytes { ptr, layout, len })
    }

    /// A copy of `bytes` aligned to `align`.
    pub fn copy_from(bytes: &[u8], align: usize) -> Option<AlignedBytes> {
        let mut buf = AlignedBytes::zeroed(bytes.len(), align)?;
        buf.as_mut_slice().copy_from_slice(bytes);
        Some(buf)
    }

    /// The address of the first byte, aligned as requested: what C code (XNNPACK) is given to
    /// write into.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// All [`len`](Self::len) bytes, borrowed for as long as the buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for as long as self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// All [`len`](Self::len) bytes, mutably borrowed.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for AlignedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
