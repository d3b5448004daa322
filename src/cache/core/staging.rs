//! Zeroed buffers XNNPACK packs a weight into before the packed bytes are written into the draft
//! of the cache file (see `packing_file.rs`), reused from one weight to the next.
//!
//! Packing straight into pages of the draft mapped shared made every page fault twice over: the
//! kernel first read the page in (readahead zeroing windows of an allocated file's pages), then
//! mapped it writable, and letting go of it afterwards unmapped it on every thread's TLB; two
//! packing threads also waited on each other's locked folios. Written with `pwrite` from a
//! buffer that stays in the CPU's cache, the bytes reach the page cache with one copy, and
//! nothing of the draft is mapped until the runtime reads it.

use crate::aligned::AlignedBytes;

/// The most buffers kept for reuse: about one per thread packing at once.
const KEPT_BUFFERS: usize = 4;
/// Larger buffers are given back to the system once used: a launch packing one large weight
/// (an LLM's embedding) does not hold its size for the rest of the launch.
const KEPT_LARGEST: usize = 8 << 20;

/// Buffers every byte of which is zero, ready for the next weight.
#[derive(Default)]
pub(crate) struct Staging {
    free: Vec<AlignedBytes>,
}

impl Staging {
    /// A kept buffer of at least `n` bytes, all zero, if one is free (the smallest that fits).
    pub fn take(&mut self, n: usize) -> Option<AlignedBytes> {
        let i = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= n)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i)?;
        Some(self.free.swap_remove(i))
    }

    /// Zeroes the first `used` bytes of `buffer` (all that was handed out of it; the rest was
    /// never written) if it is worth keeping, outside any lock; None if it is not.
    pub fn cleared(mut buffer: AlignedBytes, used: usize) -> Option<AlignedBytes> {
        if buffer.len() > KEPT_LARGEST {
            return None;
        }
        let used = used.min(buffer.len());
        buffer.as_mut_slice()[..used].fill(0);
        Some(buffer)
    }

    /// Keeps a buffer [`cleared`](Self::cleared) for the next weight, unless enough are kept.
    pub fn keep(&mut self, buffer: AlignedBytes) {
        if self.free.len() < KEPT_BUFFERS {
            self.free.push(buffer);
        }
    }

    /// Gives every kept buffer back (packing is over).
    pub fn release(&mut self) {
        self.free = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::Staging;
    use crate::aligned::AlignedBytes;

    fn allocate(n: usize) -> AlignedBytes {
        AlignedBytes::zeroed(n, 64).unwrap()
    }

    #[test]
    fn a_buffer_comes_back_zero_and_only_where_it_fits() {
        let mut staging = Staging::default();
        let mut b = allocate(1000);
        b.as_mut_slice()[..600].fill(0xA5);
        staging.keep(Staging::cleared(b, 600).unwrap());
        assert!(staging.take(1001).is_none());
        let b = staging.take(700).unwrap();
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert!(staging.take(1).is_none());
    }

    #[test]
    fn large_buffers_and_buffers_past_the_count_are_not_kept() {
        let mut staging = Staging::default();
        assert!(Staging::cleared(allocate(super::KEPT_LARGEST + 1), 1).is_none());
        for _ in 0..super::KEPT_BUFFERS + 2 {
            staging.keep(allocate(64));
        }
        assert_eq!(staging.free.len(), super::KEPT_BUFFERS);
        staging.release();
        assert!(staging.take(1).is_none());
    }
}
