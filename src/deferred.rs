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
//! Placeholders are carved from large reservations of address space (`ARENA`): a model with a
//! thousand weights makes one `mmap` for them, not a thousand, and its drop makes no `munmap` per
//! weight (each one a TLB shoot-down of every thread of the process).
//!
//! [`pin`]: DeferredData::pin
//! [`unpin`]: DeferredData::unpin

use crate::mmap::anonymous::{self, Access};
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

/// Kept small: a decoder holds a placeholder for each of its 170 weights and scales.
#[derive(Default)]
struct PinState {
    /// Packings in progress that read the bytes.
    pins: u32,
    readable: bool,
    /// How many times the bytes were read in.
    fills: u32,
    /// Why the last fill failed: the region holds zeros, and what was packed from it is not real.
    failed: Option<Box<str>>,
}

// SAFETY: the region is only an address until pinned; its contents are written under the
// state lock before any reader is told to read them, and never written while readable.
unsafe impl Send for DeferredData {}
// SAFETY: as above; all mutation goes through the state lock.
unsafe impl Sync for DeferredData {}

/// Address space placeholders are carved from: each chunk is one inaccessible, uncommitted
/// mapping, handed out front to back; a chunk whose placeholders are all gone is unmapped (the
/// newest is reused from its start instead).
static ARENA: Mutex<Vec<Chunk>> = Mutex::new(Vec::new());

/// The address space one chunk reserves (no memory: it is never committed as a whole).
const CHUNK_BYTES: usize = 256 << 20;

struct Chunk {
    base: usize,
    size: usize,
    /// Bytes handed out so far, from `base`.
    used: usize,
    /// Placeholders in it that are alive.
    live: usize,
}

/// `reserved` bytes of inaccessible address space, page aligned, from the arena.
fn take(reserved: usize) -> io::Result<NonNull<u8>> {
    let mut chunks = ARENA.lock();
    if let Some(c) = chunks.last_mut()
        && c.size - c.used >= reserved
    {
        let at = c.base + c.used;
        c.used += reserved;
        c.live += 1;
        return NonNull::new(at as *mut u8).ok_or_else(io::Error::last_os_error);
    }
    let size = reserved.max(CHUNK_BYTES);
    // Committed to nothing until a placeholder is pinned.
    let base = anonymous::reserve(size)?;
    chunks.push(Chunk {
        base: base.as_ptr() as usize,
        size,
        used: reserved,
        live: 1,
    });
    Ok(base)
}

/// Returns a placeholder's range, inaccessible and discarded already, to the arena.
fn give_back(at: usize) {
    let mut chunks = ARENA.lock();
    let Some(i) = chunks
        .iter()
        .position(|c| at >= c.base && at < c.base + c.size)
    else {
        return;
    };
    let newest = i + 1 == chunks.len();
    let c = &mut chunks[i];
    c.live -= 1;
    if c.live > 0 {
        return;
    }
    if newest {
        c.used = 0;
    } else {
        if let Some(base) = NonNull::new(c.base as *mut u8) {
            // SAFETY: the chunk is one whole reservation of ours, and no placeholder in it is
            // alive, so no address in it is held by a runtime.
            unsafe { anonymous::unreserve(base, c.size) };
        }
        chunks.remove(i);
    }
}

/// How many chunks of address space the arena holds now (a thousand placeholders fit in one).
pub fn arena_chunks() -> usize {
    ARENA.lock().len()
}

impl DeferredData {
    /// Reserves an inaccessible region for `len` bytes (plus XNNPACK's slack), in whole pages of
    /// its own. It costs address space only, no memory, until pinned.
    pub fn reserve(len: usize) -> io::Result<DeferredData> {
        let page = crate::mmap::page_size();
        let reserved = len
            .checked_add(crate::tensor::XNN_EXTRA_BYTES)
            .and_then(|n| n.checked_next_multiple_of(page))
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(DeferredData {
            base: take(reserved)?,
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
        self.state.lock().fills as usize
    }

    /// True when the last fill failed; see [`pin`](Self::pin).
    pub fn fill_failed(&self) -> bool {
        self.state.lock().failed.is_some()
    }

    /// Why the last fill failed, if it did.
    pub fn fill_error(&self) -> Option<String> {
        self.state.lock().failed.as_deref().map(str::to_string)
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
        self.protect(Access::ReadWrite)?;
        // SAFETY: the region is readable and writable now, `len` lies inside it, and no one
        // reads it before this lock is released (readers wait for `pin` to return).
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) };
        let outcome = fill(bytes);
        state.failed = outcome.as_ref().err().map(|e| e.to_string().into());
        state.fills = state.fills.saturating_add(1);
        state.readable = true;
        // Read-only from here: the bytes stand for immutable constant data.
        self.protect(Access::Read)?;
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
        self.discard();
    }

    /// Makes the region inaccessible and returns its pages to the kernel: inaccessible first,
    /// then discarded; if either fails the region only stays resident.
    fn discard(&self) {
        if self.protect(Access::None).is_ok() {
            // SAFETY: the range is this placeholder's own; its bytes are needed no longer (zero
            // if ever made accessible again, which only `pin` does, refilling them).
            unsafe { anonymous::discard(self.base, self.reserved) };
        }
    }

    fn protect(&self, access: Access) -> io::Result<()> {
        // SAFETY: the range is this placeholder's own, page-aligned; a reader of its bytes
        // holds a pin, and the pins' count keeps them accessible while any is held.
        unsafe { anonymous::protect(self.base, self.reserved, access) }
    }
}

impl Drop for DeferredData {
    fn drop(&mut self) {
        // No runtime holds the address any longer (the DeferredData outlives every runtime
        // created with it): the range goes back to the arena as it was handed out.
        if self.state.get_mut().readable {
            self.discard();
        }
        give_back(self.base.as_ptr() as usize);
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
    fn a_thousand_placeholders_share_one_reservation_and_stay_apart() {
        let before = arena_chunks();
        let all: Vec<DeferredData> = (0..1000)
            .map(|i| DeferredData::reserve(100 + 37 * i).unwrap())
            .collect();
        assert!(
            arena_chunks() <= before + 1,
            "{} chunks for 1000 placeholders",
            arena_chunks() - before
        );
        let mut ranges: Vec<(usize, usize)> = all
            .iter()
            .map(|d| (d.address() as usize, d.address() as usize + d.reserved))
            .collect();
        ranges.sort();
        assert!(
            ranges
                .iter()
                .all(|(a, _)| a % crate::mmap::page_size() == 0)
        );
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "no overlap");
        // Each one is usable on its own, its slack included.
        let fill: &Fill = &|b: &mut [u8]| {
            b.fill(7);
            Ok(())
        };
        let d = &all[500];
        d.pin(fill).unwrap();
        // SAFETY: pinned, so readable for `len` bytes plus XNNPACK's slack (whole pages).
        let seen = unsafe {
            std::slice::from_raw_parts(d.address(), d.len() + crate::tensor::XNN_EXTRA_BYTES)
        };
        assert!(seen[..d.len()].iter().all(|&b| b == 7));
        d.unpin();
        drop(all);
        // A fresh one after all are gone reuses the arena.
        let again = DeferredData::reserve(4096).unwrap();
        assert!(arena_chunks() <= before + 1);
        drop(again);
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
