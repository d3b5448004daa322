//! `xnnblob inspect`: what a `.ptd` or `.pte` file holds, as text or JSON.

use serde_json::json;
use std::fmt::Write;
use xnnblob::named_data::{
    FileDataMap, FileKind, NamedDataError, NamedDataMap, TensorLayout, alignment_of,
};
use xnnblob::sha256::{sha256, to_hex};

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
