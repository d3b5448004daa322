//! Constants whose bytes are not read until XNNPACK needs them.
//!
//! A warm launch finds every packed weight in the cache by its content identity (for
//! ExecuTorch's exports, the sha256 named key), so XNNPACK never reads the unpacked bytes. But
//! XNNPACK still wants an address per weight, and a data loader that reads files into the heap
//! (ExecuTorch's `LoadMode::File`) would read every weight to give it one. A [`DeferredData`] is
//! that address without the read: a reserved, inaccessible (`PROT_NONE`) region of the weight's
//! size. Any stray read faults at once instead of silently reading garbage, so a test that runs
//! without a fault proves nothing read it.
//!
//! When a look-up misses (a new weight, another seed), the packed-weight cache [`pin`]s the
//! region: it becomes readable and is filled with the real bytes before XNNPACK packs from it;
//! once packed, [`unpin`] returns the pages to the kernel and makes the region inaccessible again,
//! so a cold launch does not keep an unpacked copy of every weight.
//!
//! [`pin`]: DeferredData::pin
//! [`unpin`]: DeferredData::unpin

use parking_lot::Mutex;
use std::fmt;
use std::io;
use std::ptr::NonNull;

/// Fills a region with a constant's bytes (exactly its length).
pub type Fill =
    dyn Fn(&mut [u8]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> + Send + Sync;

/// A reserved region standing for a constant's bytes; see the module docs.
pub struct DeferredData {
    base: NonNull<u8>,
    /// The constant's length in bytes.
    len: usize,
    /// The whole reservation: `len` plus XNNPACK's over-read slack, in whole pages.
    reserved: usize,
    state: Mutex<PinState>,
}

#[derive(Default)]
struct PinState {
    /// Packings in progress that read the bytes.
    pins: usize,
    readable: bool,
    /// How many times the bytes were read in.
    fills: usize,
    /// Why the last fill failed: the region holds zeros, and what was packed from it is not real.
    failed: Option<String>,
}

// SAFETY: the region is only an address until pinned; its contents are written under the
// state lock before any reader is told to read them, and never written while readable.
unsafe impl Send for DeferredData {}
// SAFETY: as above; all mutation goes through the state lock.
unsafe impl Sync for DeferredData {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

impl DeferredData {
    /// Reserves an inaccessible region for `len` bytes (plus XNNPACK's slack). It costs address
    /// space only, no memory, until pinned.
    pub fn reserve(len: usize) -> io::Result<DeferredData> {
        let page = page_size();
        let reserved = len
            .checked_add(crate::tensor::XNN_EXTRA_BYTES)
            .and_then(|n| n.checked_next_multiple_of(page))
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
        // existing memory; MAP_NORESERVE because nothing is committed until pinned.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DeferredData {
            base: NonNull::new(base.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
            reserved,
            state: Mutex::new(PinState::default()),
        })
    }

    /// The address XNNPACK is given for the constant (page aligned).
    pub fn address(&self) -> *const u8 {
        self.base.as_ptr()
    }

    /// The constant's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length constant.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True while the bytes are readable (pinned).
    pub fn is_readable(&self) -> bool {
        self.state.lock().readable
    }

    /// How many times the real bytes were read in (0 on a warm launch).
    pub fn fills(&self) -> usize {
        self.state.lock().fills
    }

    /// True when the last fill failed; see [`pin`](Self::pin).
    pub fn fill_failed(&self) -> bool {
        self.state.lock().failed.is_some()
    }

    /// Why the last fill failed, if it did.
    pub fn fill_error(&self) -> Option<String> {
        self.state.lock().failed.clone()
    }

    /// Makes the bytes readable for one packing, reading them in with `fill` unless another
    /// packing holds them already. If `fill` fails the region is still made readable (holding
    /// zeros, so XNNPACK does not fault) and marked failed: the cache must not keep what is packed
    /// from it, and the delegate's init fails ([`fill_failed`](Self::fill_failed)).
    pub fn pin(&self, fill: &Fill) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut state = self.state.lock();
        state.pins += 1;
        if state.readable {
            return Ok(());
        }
        self.protect(libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: the region is readable and writable now, `len` lies inside it, and no one
        // reads it before this lock is released (readers wait for `pin` to return).
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) };
        let outcome = fill(bytes);
        state.failed = outcome.as_ref().err().map(|e| e.to_string());
        state.fills += 1;
        state.readable = true;
        // Read-only from here: the bytes stand for immutable constant data.
        self.protect(libc::PROT_READ)?;
        outcome
    }

    /// Ends one packing's use of the bytes; the last one returns the pages to the kernel and
    /// makes the region inaccessible again.
    pub fn unpin(&self) {
        let mut state = self.state.lock();
        state.pins = state.pins.saturating_sub(1);
        if state.pins > 0 || !state.readable {
            return;
        }
        state.readable = false;
        // Inaccessible first, then discarded: if either fails the region only stays resident.
        if self.protect(libc::PROT_NONE).is_ok() {
            // SAFETY: the mapping is ours and private; MADV_DONTNEED on it drops anonymous pages
            // (zero-filled if ever made accessible again, which only `pin` does, refilling them).
            unsafe {
                libc::madvise(
                    self.base.as_ptr().cast(),
                    self.reserved,
                    libc::MADV_DONTNEED,
                );
            }
        }
    }

    fn protect(&self, protection: libc::c_int) -> io::Result<()> {
        // SAFETY: the range is exactly our own mapping.
        let rc = unsafe { libc::mprotect(self.base.as_ptr().cast(), self.reserved, protection) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for DeferredData {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and no runtime holds its address any longer (the
        // DeferredData outlives every runtime created with it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.reserved) };
    }
}

impl fmt::Debug for DeferredData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("DeferredData")
            .field("len", &self.len)
            .field("readable", &state.readable)
            .field("fills", &state.fills)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_bytes_are_filled_once_and_released_with_the_last_pin() {
        let d = DeferredData::reserve(10_000).unwrap();
        assert!(!d.is_readable());
        let fill: &Fill = &|b: &mut [u8]| {
            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            Ok(())
        };
        d.pin(fill).unwrap();
        d.pin(fill).unwrap();
        assert_eq!(d.fills(), 1);
        // SAFETY: pinned, so readable for `len` bytes.
        let seen = unsafe { std::slice::from_raw_parts(d.address(), d.len()) };
        assert_eq!(seen[1234], (1234 % 256) as u8);
        d.unpin();
        assert!(d.is_readable());
        d.unpin();
        assert!(!d.is_readable());
        d.pin(fill).unwrap();
        assert_eq!(d.fills(), 2);
        assert!(!d.fill_failed());
    }

    #[test]
    fn a_failed_fill_leaves_zeros_and_says_so() {
        let d = DeferredData::reserve(64).unwrap();
        let fill: &Fill = &|_: &mut [u8]| Err("disk gone".into());
        assert!(d.pin(fill).is_err());
        assert!(d.fill_failed());
        // SAFETY: pinned (readable) even though the fill failed.
        let seen = unsafe { std::slice::from_raw_parts(d.address(), d.len()) };
        assert!(seen.iter().all(|&b| b == 0));
    }
}
