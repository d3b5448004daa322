//! How busy the process's runtimes are. Work that competes with inference for cores, memory
//! bandwidth and the disk's queue, and that no caller waits for (a cache's save of what a cold
//! launch packed, its check of packed bytes), waits for inference to pause: a launch that
//! packs runs its first tokens at the speed of a warm one.
//!
//! Process-wide, not per cache: every runtime of the process shares its cores. An execute costs
//! two atomic updates and a clock read; nothing per weight.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Executes in progress, and when the last one ended.
struct Activity {
    running: AtomicUsize,
    /// Nanoseconds since [`epoch`]; 0 while none has ended.
    last_end: AtomicU64,
}

/// Every runtime of the process.
static PROCESS: Activity = Activity::new();

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Activity {
    const fn new() -> Activity {
        Activity {
            running: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
        }
    }

    fn begin(&self) {
        // The epoch is taken before the first execute counts, so no end precedes it.
        epoch();
        self.running.fetch_add(1, Ordering::AcqRel);
    }

    fn end(&self) {
        // At least 1: 0 means "never".
        let now = (epoch().elapsed().as_nanos() as u64).max(1);
        self.last_end.fetch_max(now, Ordering::AcqRel);
        self.running.fetch_sub(1, Ordering::AcqRel);
    }

    fn quiet_for(&self) -> Duration {
        if self.running.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        match self.last_end.load(Ordering::Acquire) {
            0 => Duration::MAX,
            end => epoch().elapsed().saturating_sub(Duration::from_nanos(end)),
        }
    }
}

/// Inference in progress, from its creation to its drop. Every execute of a
/// [`Runtime`](super::Runtime) holds one; an app may hold one across its own work between
/// executes (sampling a token, a tokenizer), so that the caches' background work waits for the
/// end of a whole generation rather than for a gap between two tokens.
#[must_use = "inference counts only while this is held"]
pub struct Inference(());

impl Inference {
    /// Counts inference as running until the value is dropped.
    pub fn begin() -> Inference {
        PROCESS.begin();
        Inference(())
    }
}

impl Drop for Inference {
    fn drop(&mut self) {
        PROCESS.end();
    }
}

/// How long no runtime of the process has executed: zero while one does, and
/// [`Duration::MAX`] when none ever has.
pub fn quiet_for() -> Duration {
    PROCESS.quiet_for()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_for_is_zero_during_an_execute_and_grows_after_the_last() {
        let activity = Activity::new();
        assert_eq!(activity.quiet_for(), Duration::MAX, "none has run");
        activity.begin();
        assert_eq!(activity.quiet_for(), Duration::ZERO);
        activity.begin();
        activity.end();
        assert_eq!(activity.quiet_for(), Duration::ZERO, "one still runs");
        activity.end();
        let first = activity.quiet_for();
        assert!(
            first < Duration::from_secs(1),
            "{first:?} since the last ended"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(activity.quiet_for() >= first + Duration::from_millis(20));
    }

    #[test]
    fn an_execute_counts_until_it_is_dropped() {
        // Other tests' runtimes share the process's count: only "busy while held" is certain.
        let inference = Inference::begin();
        assert_eq!(quiet_for(), Duration::ZERO);
        drop(inference);
        assert!(quiet_for() < Duration::MAX);
    }
}
