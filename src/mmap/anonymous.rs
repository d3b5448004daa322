//! Anonymous memory from the kernel: the other half of what this module maps. Two kinds:
//!
//! - [`OwnPages`]: zeroed pages of a buffer's own, unmapped on drop (large aligned buffers,
//!   whose freed memory glibc would otherwise keep resident).
//! - Reserved address space ([`reserve`]): inaccessible, committed to nothing, later made
//!   readable range by range and discarded again (deferred constants, whose addresses XNNPACK
//!   keys its look-ups by before any byte is read).
//!
//! Every `mmap`, `munmap`, `mprotect` and `madvise` on anonymous memory is here, each with why it
//! is sound; the functions that act on a range a caller owns are `unsafe` with that contract.

use std::io;
use std::ptr::NonNull;

/// The size of a transparent huge page on x86-64.
const HUGE_PAGE: usize = 2 << 20;

/// Zeroed, page-aligned anonymous pages of their own, given back to the kernel on drop.
pub struct OwnPages(memmap2::MmapMut);

impl OwnPages {
    /// `len` zero bytes on fresh pages; None when the kernel refuses them. From 2 MiB on they
    /// are advised into transparent huge pages: packing writes hundreds of MiB into fresh
    /// memory, and one fault and one clear per 2 MiB instead of per 4 KiB made a cold load of a
    /// 384 MiB model a third faster here. A hint only: the kernel may decline.
    pub fn zeroed(len: usize) -> Option<OwnPages> {
        let mut pages = memmap2::MmapOptions::new().len(len).map_anon().ok()?;
        let start = pages.as_mut_ptr() as usize;
        let first = start.next_multiple_of(HUGE_PAGE);
        let end = (start + pages.len()) & !(HUGE_PAGE - 1);
        if end > first {
            // SAFETY: [first, end) lies inside this private anonymous map; MADV_HUGEPAGE
            // changes how its pages are backed, never their contents.
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
        }
        Some(OwnPages(pages))
    }

    /// The first byte, page-aligned.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a reserved range may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: any touch faults.
    None,
    /// Reads only.
    Read,
    /// Reads and writes.
    ReadWrite,
}

/// `size` bytes of address space at an address of the kernel's choosing, inaccessible and
/// committed to nothing (`MAP_NORESERVE`) until made accessible.
pub fn reserve(size: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(base.cast()).ok_or_else(io::Error::last_os_error)
}

/// Gives a range from [`reserve`] back to the kernel.
///
/// # Safety
/// `base` and `size` are exactly what one [`reserve`] returned and took, and no address inside
/// is held any longer (by Rust or by XNNPACK).
pub unsafe fn unreserve(base: NonNull<u8>, size: usize) {
    // SAFETY: the caller's contract: the whole mapping, and nothing refers into it.
    unsafe { libc::munmap(base.as_ptr().cast(), size) };
}

/// Sets what `[at, at + len)` may be used for.
///
/// # Safety
/// The range lies inside one [`reserve`]d range the caller owns, page-aligned; no reference
/// into it outlives a change that forbids its use.
pub unsafe fn protect(at: NonNull<u8>, len: usize, access: Access) -> io::Result<()> {
    let protection = match access {
        Access::None => libc::PROT_NONE,
        Access::Read => libc::PROT_READ,
        Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
    };
    // SAFETY: the caller's contract: a range of our own private mapping.
    let rc = unsafe { libc::mprotect(at.as_ptr().cast(), len, protection) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Returns the pages of `[at, at + len)` to the kernel: they read as zeros if ever made
/// accessible again.
///
/// # Safety
/// As [`protect`]; nothing relies on the range's bytes any longer.
pub unsafe fn discard(at: NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract: a range of our own private anonymous mapping, whose bytes
    // no one needs; MADV_DONTNEED drops them.
    unsafe { libc::madvise(at.as_ptr().cast(), len, libc::MADV_DONTNEED) };
}
