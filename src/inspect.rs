//! `xnnblob inspect`: what a `.ptd` or `.pte` file holds, as text or JSON.

use crate::cache::BlobId;
use crate::named_data::{FileDataMap, FileKind, NamedDataError, NamedDataMap, TensorLayout};
use crate::sha256::{sha256, to_hex};
use serde_json::json;
use std::fmt::Write;

/// The largest power of two (up to 4096, a page) that divides `offset`: the alignment a
/// mapped segment starting there has.
pub fn alignment_of(offset: usize) -> usize {
    if offset == 0 {
        4096
    } else {
        (1usize << offset.trailing_zeros()).min(4096)
    }
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Ptd => "ptd",
        FileKind::Pte => "pte",
    }
}

fn json_layout(layout: Option<&TensorLayout>) -> serde_json::Value {
    match layout {
        None => serde_json::Value::Null,
        Some(l) => json!({
            "scalar_type": l.scalar_type().name(),
            "scalar_type_code": l.scalar_type().code(),
            "sizes": l.sizes(),
            "dim_order": l.dim_order(),
            "nbytes": l.nbytes(),
        }),
    }
}

/// One JSON object: `file`, `kind`, `segments` and `entries`, each entry
/// `{key, segment_index, offset, size, layout}` (+ `sha256` when asked).
pub fn to_json(map: &FileDataMap, with_sha256: bool) -> Result<String, NamedDataError> {
    let segments: Vec<_> = map
        .segments()
        .iter()
        .enumerate()
        .map(|(i, &(offset, size))| {
            json!({"index": i, "offset": offset, "size": size, "alignment": alignment_of(offset)})
        })
        .collect();
    let mut entries = Vec::with_capacity(map.entries().len());
    for e in map.entries() {
        let mut entry = json!({
            "key": e.key,
            "segment_index": e.segment_index,
            "offset": e.offset,
            "size": e.size,
            "layout": json_layout(e.layout.as_ref()),
        });
        if with_sha256 {
            let data = map.get_data(&e.key)?;
            entry["sha256"] = to_hex(&sha256(&data)).into();
        }
        entries.push(entry);
    }
    let document = json!({
        "file": map.name(),
        "kind": kind_name(map.kind()),
        "segments": segments,
        "entries": entries,
    });
    Ok(document.to_string())
}

/// A readable listing: one line per segment, one per key.
pub fn to_text(map: &FileDataMap, with_sha256: bool) -> String {
    let mut out = String::new();
    let total: usize = map.segments().iter().map(|s| s.1).sum();
    let _ = writeln!(
        out,
        "{} ({}): {} keys, {} segments, {} bytes of segment data",
        map.name(),
        kind_name(map.kind()),
        map.num_keys(),
        map.segments().len(),
        total
    );
    let _ = writeln!(out, "segments:");
    for (i, &(offset, size)) in map.segments().iter().enumerate() {
        let _ = writeln!(
            out,
            "  {i:>4}  offset {offset:>12}  size {size:>12}  aligned {:>4}",
            alignment_of(offset)
        );
    }
    let _ = writeln!(out, "keys:");
    for e in map.entries() {
        let layout = match &e.layout {
            None => "no layout".to_string(),
            Some(l) => format!(
                "{} {:?} dim order {:?}",
                l.scalar_type(),
                l.sizes(),
                l.dim_order()
            ),
        };
        let _ = write!(
            out,
            "  {}  segment {}  offset {}  size {}  {layout}",
            e.key, e.segment_index, e.offset, e.size
        );
        if with_sha256 {
            let data = map.get_data(&e.key).expect("listed keys exist");
            let _ = write!(out, "  sha256 {}", to_hex(&sha256(&data)));
        }
        out.push('\n');
    }
    out
}

/// A key named by content whose bytes do not hash to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMismatch {
    /// The key, as the file names it.
    pub key: String,
    /// The sha256 of the bytes it holds, in hex.
    pub actual: String,
}

/// Checks every content-named key of `map` against the sha256 of its bytes (reading every such
/// blob: a by-hand check, `xnnblob inspect --verify-keys`). A packed-weight cache takes such a key
/// as the blob's identity without hashing, so a file edited after export under the same keys
/// would be served the old packing. Returns how many keys were checked and which did not match.
pub fn verify_keys(map: &FileDataMap) -> Result<(usize, Vec<KeyMismatch>), NamedDataError> {
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for i in 0..map.num_keys() {
        let key = map.key_at(i)?;
        // The one rule for content keys (`BlobId::from_named_key`), as the caches use it.
        let Some(claimed) = BlobId::from_named_key(key) else {
            continue;
        };
        checked += 1;
        let actual = BlobId::of_bytes(map.get_data(key)?.data());
        if actual != claimed {
            mismatches.push(KeyMismatch {
                key: key.to_string(),
                actual: actual.to_string(),
            });
        }
    }
    Ok((checked, mismatches))
}

#[cfg(test)]
mod verify_keys_tests {
    use super::*;
    use crate::named_data::NamedBlobStore;

    #[test]
    fn a_blob_edited_under_its_content_key_is_reported() {
        let weights = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let key = to_hex(&sha256(&weights));
        let scales = [9u8; 16];
        let scale_key = format!("scale_{}", to_hex(&sha256(&scales)));
        let build = |w: &[u8]| {
            let mut store = NamedBlobStore::new();
            store.add_named_blob(&key, w, 16, "t", None).unwrap();
            store
                .add_named_blob(&scale_key, &scales, 16, "t", None)
                .unwrap();
            store
                .add_named_blob("not_content_named", &[0u8; 4], 16, "t", None)
                .unwrap();
            FileDataMap::from_bytes(&store.serialize("t").unwrap(), Some(FileKind::Ptd), "t")
                .unwrap()
        };
        assert_eq!(verify_keys(&build(&weights)).unwrap(), (2, vec![]));
        let mut edited = weights;
        edited[3] = 0;
        let (checked, bad) = verify_keys(&build(&edited)).unwrap();
        assert_eq!(checked, 2);
        assert_eq!(
            bad,
            vec![KeyMismatch {
                key: key.clone(),
                actual: to_hex(&sha256(&edited))
            }]
        );
    }
}
