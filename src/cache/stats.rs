//! What a packed-weight cache reports of its work in this process.

use super::format::EntryKey;
// Named by the documentation's links.
#[cfg(doc)]
use super::{CacheError, KeyTrust, PackedWeightsCache, VerifyPacked};

/// What the cache has done in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// XNNPACK look-ups that found packed weights.
    pub hits: usize,
    /// XNNPACK look-ups that found no packed weights (XNNPACK packs them next).
    pub misses: usize,
    /// Weights XNNPACK packed (one `reserve_space` each).
    pub packed: usize,
    /// Packed weights whose unpacked data was not registered: kept in memory, never saved.
    pub unregistered: usize,
    /// Entries known (from the file and packed here).
    pub entries: usize,
    /// Constants kept unpacked in entries of their own (from the file and kept here), for
    /// hosts whose data maps cost a system call per constant; not counted in `entries`.
    pub kept_constants: usize,
    /// Those entries this process read a constant from instead of its source (each counted
    /// once, however often it was read).
    pub kept_served: usize,
    /// Total size in bytes of the packed weights of every known entry.
    pub packed_bytes: usize,
    /// Entries packed here and not yet saved.
    pub unsaved: usize,
    /// Entries whose packed bytes live in memory rather than in a mapped file.
    pub heap_entries: usize,
    /// Placeholder constants whose bytes were read in because a look-up missed (0 on a warm
    /// launch: no unpacked weight byte was read).
    pub deferred_fills: usize,
    /// Entries of the file whose packed bytes failed their checksum when checked (see
    /// [`VerifyPacked`]): forgotten, and left out of the file at the next save.
    pub corrupt_found: usize,
    /// Entries of the file whose packed bytes were hashed to check them (see [`VerifyPacked`]).
    pub checked: usize,
    /// Entries this process's saves left out of the file to keep it within its budget.
    pub evicted: usize,
    /// Named keys whose bytes did not hash to what the key states (see [`KeyTrust`]): their
    /// bytes' own hash was used instead.
    pub key_mismatches: usize,
    /// Entries forgotten because the file was cut short under its map (see
    /// [`CacheError::Truncated`]).
    pub truncated: usize,
    /// Entries forgotten because the operator that looked them up reads another number of
    /// packed bytes than they hold (a file whose index lies): repacked, and repaired in the file
    /// at the next save.
    pub wrong_size: usize,
    /// Permission bits (as `chmod` writes them: 0o044 is read by group and others) that the
    /// cache file had, when a model using it was loaded, beyond what that model's files allow
    /// (see [`PackedWeightsCache::limit_permissions`]); 0 when it had none. The file is used
    /// as it is; `xnnblob run` and the ExecuTorch backend say so
    /// ([`PackedWeightsCache::permissions_note`]).
    pub excess_permissions: u32,
}

/// An entry whose packed bytes no longer match their checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEntry {
    /// What the entry is looked up by.
    pub key: EntryKey,
    /// Byte offset of the packed region from the start of the mapped cache file (0 for an entry
    /// whose packed bytes are in memory).
    pub offset: u64,
    /// Length of the packed region in bytes.
    pub size: u64,
}
