//! How big a cache file may grow, and which entries leave when it would grow beyond that. An app
//! that ships a new model every month would otherwise keep every old model's packed weights
//! forever: entries are only ever added, and dropped when superseded by a repack.
//!
//! Each entry records the number of the last save whose process used it (see
//! [`FileEntry::last_used`]). A save gives the entries its process used the next number; those
//! are the live ones, never evicted. The others go, least recently used first, until the file's
//! packed bytes fit the budget.

use super::format::FileEntry;

/// How many bytes of packed weights a cache file may hold, enforced at each save.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheBudget {
    /// Twice the packed bytes the saving process used: the working set and about one older
    /// version of it. Processes that share one file but load different models each count only
    /// their own as live; give such files a [`Bytes`](CacheBudget::Bytes) budget that holds
    /// every model.
    #[default]
    TwiceLive,
    /// At most this many bytes of packed weights (live entries stay even beyond it).
    Bytes(u64),
    /// No limit: an entry leaves only when a repack supersedes it.
    Unlimited,
}

impl CacheBudget {
    /// The most packed bytes a file may hold when `live` bytes of it are live.
    pub fn limit(self, live: u64) -> u64 {
        match self {
            CacheBudget::TwiceLive => live.saturating_mul(2),
            CacheBudget::Bytes(b) => b,
            CacheBudget::Unlimited => u64::MAX,
        }
    }
}

/// What a budget makes of a set of entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Packed bytes of the live entries (`last_used` equal to the live save number).
    pub live_bytes: u64,
    /// Packed bytes of the others.
    pub stale_bytes: u64,
    /// Indices (into the entries given) of those that leave, least recently used first.
    pub evicted: Vec<usize>,
    /// Their packed bytes.
    pub evicted_bytes: u64,
}

/// Which of `entries` leave under `budget`, when those with `last_used == live` are live.
/// Stale entries leave least recently used first (the larger first among equals, so the fewest
/// leave), until the rest fit.
pub fn plan(entries: &[FileEntry], live: u64, budget: CacheBudget) -> Evictions {
    let live_bytes: u64 = entries
        .iter()
        .filter(|e| e.last_used == live)
        .map(|e| e.size)
        .sum();
    let total: u64 = entries.iter().map(|e| e.size).sum();
    let limit = budget.limit(live_bytes);
    let mut stale: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].last_used != live)
        .collect();
    stale.sort_by_key(|&i| (entries[i].last_used, std::cmp::Reverse(entries[i].size)));
    let mut out = Evictions {
        live_bytes,
        stale_bytes: total - live_bytes,
        ..Evictions::default()
    };
    let mut kept = total;
    for i in stale {
        if kept <= limit {
            break;
        }
        kept -= entries[i].size;
        out.evicted_bytes += entries[i].size;
        out.evicted.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::BlobId;
    use crate::cache::format::EntryKey;

    fn entry(n: u8, size: u64, last_used: u64) -> FileEntry {
        FileEntry {
            key: EntryKey {
                kernel: BlobId([n; 32]),
                bias: BlobId::NONE,
                seed: 0,
            },
            offset: 0,
            size,
            checksum: 0,
            last_used,
        }
    }

    #[test]
    fn the_least_recently_used_leave_first_and_live_entries_never() {
        // Save 5 used entries 0 and 1 (300 bytes live); older versions are 2 to 4.
        let entries = [
            entry(0, 100, 5),
            entry(1, 200, 5),
            entry(2, 250, 3),
            entry(3, 150, 1),
            entry(4, 100, 4),
        ];
        let p = plan(&entries, 5, CacheBudget::TwiceLive);
        assert_eq!((p.live_bytes, p.stale_bytes), (300, 500));
        // 800 bytes against a limit of 600: the entry of save 1 leaves (650), then save 3's.
        assert_eq!(p.evicted, [3, 2]);
        assert_eq!(p.evicted_bytes, 400);

        assert_eq!(
            plan(&entries, 5, CacheBudget::Unlimited).evicted,
            [0usize; 0]
        );
        let all_stale = plan(&entries, 5, CacheBudget::Bytes(0));
        assert_eq!(
            all_stale.evicted,
            [3, 2, 4],
            "live entries stay beyond the budget"
        );
        assert_eq!(
            plan(&entries, 5, CacheBudget::Bytes(800)).evicted,
            [0usize; 0]
        );
    }
}
