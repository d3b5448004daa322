//! How many bytes of named data xnnblob has copied in this process. A launch borrows what it
//! reads as it is and leaves the weights it finds packed unread, so a warm launch copies
//! nothing; a cold one copies only the weights it fills placeholders with, and constants whose
//! source leaves no room for XNNPACK's over-read.

use std::sync::atomic::{AtomicU64, Ordering};

static COPIED: AtomicU64 = AtomicU64::new(0);

/// The bytes of named data copied so far in this process.
pub fn copied_bytes() -> u64 {
    COPIED.load(Ordering::Relaxed)
}

/// Counts a copy of `bytes` bytes of named data: every copy out of a map calls it (a map
/// implemented elsewhere, such as ExecuTorch's, included).
pub fn count_copy(bytes: usize) {
    COPIED.fetch_add(bytes as u64, Ordering::Relaxed);
}
