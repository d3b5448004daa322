//! The hash maps a warm launch fills (keys, pointers, content ids, a delegate's value ids) use
//! foldhash: several times cheaper than SipHash on short keys, and seeded per process, so keys
//! crafted against one build cannot be replayed to degrade every launch. Public for the faces'
//! own such maps (the ExecuTorch face's index of a named-data map's keys).

/// A `HashMap` with foldhash's fast, per-process-seeded hasher.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `HashSet` with the same hasher as [`FastMap`] (the delegate's sets of value ids, a cache
/// file's keys as its index is read).
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
