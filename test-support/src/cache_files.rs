//! Reading what a packed-weight cache file holds, whatever CPU it was packed for: to compare the
//! packing two files hold (a bundle made ahead of time against a cold launch's file).

use std::collections::BTreeMap;
use std::path::Path;
use xnnblob::cache::format;

/// Every packed entry of the cache file at `path` (not those keeping constants), by its key
/// (kernel, bias, seed) in words, with its packed bytes; the file is read as packed for the
/// build and CPU its header names, and must be valid for them.
pub fn packed_entries(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let compat = format::recorded_compat(&bytes)
        .unwrap_or_else(|| panic!("{}: not a cache file of this format", path.display()));
    let decoded =
        format::decode(&bytes, &compat).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    decoded
        .entries
        .iter()
        // Entries that keep a constant's own bytes are not packings.
        .filter(|e| !e.key.keeps_constant())
        .map(|e| {
            let packed = bytes[e.offset as usize..(e.offset + e.size) as usize].to_vec();
            (format!("{:?}", e.key), packed)
        })
        .collect()
}

/// Asserts that two cache files hold the same packing: the same keys, each with the same packed
/// bytes (where in the file each lies, and what else the file records, may differ).
pub fn assert_same_packing(a: &Path, b: &Path) {
    let (left, right) = (packed_entries(a), packed_entries(b));
    assert!(!left.is_empty(), "{}: no entries", a.display());
    let keys = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&left),
        keys(&right),
        "{} and {}: keys",
        a.display(),
        b.display()
    );
    for (key, bytes) in &left {
        assert!(
            right[key] == *bytes,
            "{} and {}: entry {key} packed otherwise",
            a.display(),
            b.display()
        );
    }
}

/// The number `xnnblob cache stats` printed just before `after` (" entries,", " kept
/// constants") in `text`.
pub fn stats_count(text: &str, after: &str) -> usize {
    let at = text
        .find(after)
        .unwrap_or_else(|| panic!("no {after:?} in {text}"));
    text[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before {after:?} in {text}"))
}
