//! Owned byte buffers with a chosen alignment (a `Vec<u8>` only promises 1).

use crate::mmap::anonymous::OwnPages;
use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// A zero-initialised buffer whose start is aligned to a power of two.
pub struct AlignedBytes {
    /// Held for its drop, which frees it.
    _memory: Memory,
    /// The first aligned byte inside it.
    ptr: NonNull<u8>,
    len: usize,
}

/// Where an [`AlignedBytes`] lives.
enum Memory {
    /// The allocator's, as `alloc_zeroed` returned it with this layout.
    Heap { base: NonNull<u8>, layout: Layout },
    /// Pages of its own (see [`OWN_PAGES_FROM`]), unmapped on drop.
    Pages { _map: OwnPages },
}

/// From this size on, a buffer gets pages of its own from the kernel, given back when it is
/// dropped. From the allocator, a packed weight freed once the cache file holds it stayed
/// resident: once a large block has been freed, glibc serves blocks below 32 MiB from its heap,
/// which it cannot shrink past blocks still in use (a cold launch of an 8da4w decoder peaked 60
/// MiB above its packed weights).
const OWN_PAGES_FROM: usize = 256 << 10;

// SAFETY: AlignedBytes exclusively owns its memory, like a Box<[u8]>.
unsafe impl Send for AlignedBytes {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// `len` zero bytes aligned to `align`; None if `align` is not a power of two or the
    /// allocation fails.
    pub fn zeroed(len: usize, align: usize) -> Option<AlignedBytes> {
        if !align.is_power_of_two() {
            return None;
        }
        if len >= OWN_PAGES_FROM {
            // Fresh anonymous pages are zero and page-aligned: over-mapped only for an
            // alignment above the page.
            let extra = if align > SMALLEST_PAGE { align } else { 0 };
            let mut pages = OwnPages::zeroed(len.checked_add(extra)?)?;
            let base = NonNull::new(pages.as_mut_ptr())?;
            let skip = base.as_ptr().align_offset(align);
            // SAFETY: skip < align <= extra (or 0), so ptr and the len bytes after it lie
            // inside the map.
            let ptr = unsafe { base.add(skip) };
            return Some(AlignedBytes {
                _memory: Memory::Pages { _map: pages },
                ptr,
                len,
            });
        }
        // Over-allocated at the allocator's own alignment and aligned by hand: for an alignment
        // above its own, the allocator zeroes by writing every byte, where calloc takes fresh
        // pages from the kernel already zero.
        let layout = Layout::from_size_align(len.checked_add(align)?.max(1), 1).ok()?;
        // SAFETY: the layout's size is non-zero.
        let base = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        let skip = base.as_ptr().align_offset(align);
        // SAFETY: skip < align, so ptr and the len bytes after it lie inside the allocation.
        let ptr = unsafe { base.add(skip) };
        Some(AlignedBytes {
            _memory: Memory::Heap { base, layout },
            ptr,
            len,
        })
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

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Heap { base, layout } = self {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { alloc::dealloc(base.as_ptr(), *layout) }
        }
    }
}

/// The smallest page size of any kernel xnnblob runs on (16 and 64 KiB pages are multiples).
const SMALLEST_PAGE: usize = 4096;

/// How many bytes after `end` (the address one past a readable buffer) can be read without a
/// fault: the rest of its last page, since memory is protected page by page. XNNPACK's
/// over-read of its inputs needs `XNN_EXTRA_BYTES` (16) of them;
/// a host that sizes its buffers exactly (ExecuTorch) leaves them there unless the buffer ends
/// on a page boundary. None where AddressSanitizer runs and holds those bytes as another
/// allocation's (or none's): reading them faults nothing, but is what it reports, so the
/// caller pads instead, as it does at a page's end.
pub fn readable_in_page_after(end: usize) -> usize {
    let rest = end.next_multiple_of(SMALLEST_PAGE) - end;
    if rest > 0 && sanitizer_poisoned(end, rest) {
        0
    } else {
        rest
    }
}

/// Whether AddressSanitizer's runtime is in this process and poisons any byte of
/// `[at, at + len)`. Its query is looked up once: a process without it pays one `dlsym`.
fn sanitizer_poisoned(at: usize, len: usize) -> bool {
    type RegionIsPoisoned = unsafe extern "C" fn(*const libc::c_void, usize) -> *const libc::c_void;
    static QUERY: std::sync::OnceLock<Option<RegionIsPoisoned>> = std::sync::OnceLock::new();
    let query = QUERY.get_or_init(|| {
        // SAFETY: a look-up by a NUL-terminated name in the process's global scope.
        let found =
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__asan_region_is_poisoned".as_ptr()) };
        // SAFETY: where the symbol exists it is ASan's `void *__asan_region_is_poisoned(void
        // *beg, size_t size)`, of this very signature.
        (!found.is_null())
            .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RegionIsPoisoned>(found) })
    });
    // SAFETY: the query reads ASan's shadow only, for any address range.
    query.is_some_and(|q| !unsafe { q(at as *const libc::c_void, len) }.is_null())
}

#[cfg(test)]
mod tests {
    use super::{AlignedBytes, OWN_PAGES_FROM};

    #[test]
    fn small_and_large_buffers_are_zero_aligned_and_writable() {
        for len in [0, 1, 4095, OWN_PAGES_FROM - 1, OWN_PAGES_FROM, 3 << 20] {
            for align in [1, 64, 4096, 1 << 16] {
                let mut b = AlignedBytes::zeroed(len, align).unwrap();
                assert_eq!(b.len(), len);
                assert_eq!(b.as_ptr() as usize % align, 0, "{len} bytes at {align}");
                assert!(b.iter().all(|&x| x == 0), "{len} bytes at {align}");
                b.as_mut_slice().iter_mut().for_each(|x| *x = 0xa5);
                assert!(b.iter().all(|&x| x == 0xa5));
            }
        }
        assert!(AlignedBytes::zeroed(8, 3).is_none());
    }
}
