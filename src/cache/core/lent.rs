//! Constants lent to be kept: a launch that reads a constant XNNPACK reads at every launch
//! (see [`CacheCore::keep_constant`]) hands the cache the buffer its data source lent, not a
//! copy. The copy into an entry of the cache's own is made when a save next runs, on the
//! saver's thread, off the launch: on a small program's cold launch, copying its 60 such
//! constants (MobileNetV2, static int8) took 0.14-0.18 ms of a 2.2 ms load.
//!
//! A lent buffer is only valid while its lender (a delegate) lives: ExecuTorch's loaders free
//! what they lend when the program goes, and a buffer kept past that would be freed into a
//! loader that is gone. So nothing takes a lent buffer out of the list's lock: the saver copies
//! under it, and a lender that ends copies, under it, what no save copied yet (a process that
//! ends before its save pays the copies at its end, not in its launch).

use super::CacheCore;
use crate::aligned::AlignedBytes;
use crate::cache::format::REGION_ALIGNMENT;
use crate::cache::identity::BlobId;
use crate::named_data::DataBuffer;

/// A constant lent to be kept.
pub(super) struct Lent {
    content: BlobId,
    data: DataBuffer,
    /// Who lent it ([`CacheCore::take_back_lent`]).
    lender: u64,
    /// Its place in the order of first use, taken when it was lent: kept constants lie in the
    /// file in the order a launch reads them.
    order: u64,
}

impl CacheCore {
    /// Keeps the constant `content`, whose bytes `data` holds, lent by `lender`: copied into an
    /// entry of its own at the next save ([`keep_lent`](Self::keep_lent)), unless `lender`
    /// takes it back first. Nothing is lent where an entry, or a constant lent before, keeps
    /// it already.
    pub fn lend_constant(&self, content: BlobId, data: DataBuffer, lender: u64) {
        let order = {
            let mut state = self.state.lock();
            if state.by_key.contains_key(&Self::kept_key(content)) {
                return;
            }
            state.next_first_look()
        };
        let mut lent = self.lent.lock();
        if lent.iter().any(|l| l.content == content) {
            return;
        }
        lent.push(Lent {
            content,
            data,
            lender,
            order,
        });
    }

    /// Whether a lent constant waits to be copied (a save has something to write).
    pub fn has_lent(&self) -> bool {
        !self.lent.lock().is_empty()
    }

    /// Copies every lent constant into an entry of its own, unsaved, in its order of first
    /// use; what no longer fits in memory is left unkept.
    pub fn keep_lent(&self) {
        let mut lent = self.lent.lock();
        // Copied and dropped under the lock: every lender is alive while its buffers are listed.
        let all = std::mem::take(&mut *lent);
        self.keep_copies(all);
    }

    /// Copies what `lender` lent and no save copied yet, as [`keep_lent`](Self::keep_lent):
    /// it ends, and its buffers with it.
    pub fn take_back_lent(&self, lender: u64) {
        let mut lent = self.lent.lock();
        let (its, others): (Vec<Lent>, Vec<Lent>) = std::mem::take(&mut *lent)
            .into_iter()
            .partition(|l| l.lender == lender);
        *lent = others;
        self.keep_copies(its);
    }

    /// Copies `lent` into entries of their own (called under the list's lock, or by their
    /// lender).
    fn keep_copies(&self, lent: Vec<Lent>) {
        if lent.is_empty() {
            return;
        }
        let copies: Vec<(BlobId, u64, Option<AlignedBytes>)> = lent
            .iter()
            .map(|l| {
                let copy = AlignedBytes::copy_from(l.data.data(), REGION_ALIGNMENT);
                (l.content, l.order, copy)
            })
            .collect();
        drop(lent);
        let mut state = self.state.lock();
        for (content, order, copy) in copies {
            if let Some(copy) = copy {
                state.insert_kept(Self::kept_key(content), copy, order);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named_data::Backing;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Bytes lent by a lender that may end: read or freed after it ended, they fail the test
    /// (what would read or free memory its loader no longer holds).
    struct Loan {
        bytes: Vec<u8>,
        lender_alive: Arc<AtomicBool>,
        misuses: Arc<AtomicUsize>,
    }

    impl Backing for Loan {
        fn bytes(&self) -> &[u8] {
            if !self.lender_alive.load(Ordering::SeqCst) {
                self.misuses.fetch_add(1, Ordering::SeqCst);
            }
            &self.bytes
        }
    }

    impl Drop for Loan {
        fn drop(&mut self) {
            if !self.lender_alive.load(Ordering::SeqCst) {
                self.misuses.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn loan(bytes: Vec<u8>, alive: &Arc<AtomicBool>, misuses: &Arc<AtomicUsize>) -> DataBuffer {
        let len = bytes.len();
        let backing = Arc::new(Loan {
            bytes,
            lender_alive: alive.clone(),
            misuses: misuses.clone(),
        });
        DataBuffer::new(backing, 0, len).expect("the whole loan")
    }

    fn content(n: u8) -> BlobId {
        BlobId::of_bytes(&[n; 3])
    }

    #[test]
    fn a_lent_constant_is_kept_by_the_next_save_and_served_from_the_copy() {
        let core = CacheCore::default();
        let (alive, misuses) = (Arc::new(AtomicBool::new(true)), Arc::default());
        core.lend_constant(content(1), loan(vec![7; 100], &alive, &misuses), 1);
        // Lent twice, kept once.
        core.lend_constant(content(1), loan(vec![7; 100], &alive, &misuses), 1);
        assert!(core.has_lent() && core.has_unsaved());
        assert!(
            core.kept_constant(content(1), 100).is_none(),
            "not kept before a save"
        );
        core.keep_lent();
        assert!(!core.has_lent());
        alive.store(false, Ordering::SeqCst);
        let kept = core
            .kept_constant(content(1), 100)
            .expect("kept by the save");
        assert_eq!(kept.data(), &[7; 100][..]);
        assert!(
            core.state.lock().has_unsaved(),
            "the copy waits for the save to write it"
        );
        core.take_back_lent(1);
        assert_eq!(misuses.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_lender_that_ends_first_has_its_constants_copied_and_leaves_the_others_lent() {
        let core = CacheCore::default();
        let (first, second) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(true)),
        );
        let misuses = Arc::new(AtomicUsize::new(0));
        core.lend_constant(content(1), loan(vec![1; 10], &first, &misuses), 1);
        core.lend_constant(content(2), loan(vec![2; 20], &second, &misuses), 2);
        core.take_back_lent(1);
        first.store(false, Ordering::SeqCst);
        assert_eq!(
            core.kept_constant(content(1), 10)
                .map(|d| d.data().to_vec()),
            Some(vec![1; 10])
        );
        assert!(
            core.has_lent(),
            "the second lender's constant is still lent"
        );
        assert!(core.kept_constant(content(2), 20).is_none());
        core.keep_lent();
        second.store(false, Ordering::SeqCst);
        assert!(core.kept_constant(content(2), 20).is_some());
        assert_eq!(misuses.load(Ordering::SeqCst), 0);
    }

    /// Lenders lend and end on several threads while saves copy on another: no buffer is read
    /// or freed after its lender ended, and every constant ends up kept once.
    #[test]
    fn lenders_ending_while_saves_copy_never_outlive_their_loans() {
        let core = Arc::new(CacheCore::default());
        let misuses = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let saver = {
            let (core, done) = (core.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    core.keep_lent();
                    std::thread::yield_now();
                }
            })
        };
        let lenders: Vec<_> = (0..4u64)
            .map(|t| {
                let (core, misuses) = (core.clone(), misuses.clone());
                std::thread::spawn(move || {
                    for round in 0..50u64 {
                        let lender = t * 1000 + round + 1;
                        let alive = Arc::new(AtomicBool::new(true));
                        for k in 0..4u8 {
                            let n = (t as u8) * 64 + (round as u8 % 16) * 4 + k;
                            let data = loan(vec![n; 64 + k as usize], &alive, &misuses);
                            core.lend_constant(content(n), data, lender);
                        }
                        core.take_back_lent(lender);
                        alive.store(false, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for l in lenders {
            l.join().expect("a lender");
        }
        done.store(true, Ordering::SeqCst);
        saver.join().expect("the saver");
        assert_eq!(
            misuses.load(Ordering::SeqCst),
            0,
            "a loan outlived its lender"
        );
        assert!(!core.has_lent());
        for t in 0..4u8 {
            for r in 0..16u8 {
                for k in 0..4u8 {
                    let n = t * 64 + r * 4 + k;
                    let kept = core.kept_constant(content(n), 64 + k as usize);
                    assert_eq!(kept.map(|d| d.data()[0]), Some(n), "constant {n}");
                }
            }
        }
        let state = core.state.lock();
        assert_eq!(state.entries.len(), 4 * 16 * 4, "each kept once");
    }
}
