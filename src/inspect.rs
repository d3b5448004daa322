//! `xnnblob inspect`: what a `.ptd` or `.pte` file holds, as text or JSON.

use crate::named_data::{FileDataMap, FileKind, NamedDataMap, TensorLayout};
use crate::sha256::{sha256, to_hex};
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

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_list<T: std::fmt::Display>(items: &[T]) -> String {
    let parts: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn json_layout(out: &mut String, layout: Option<&TensorLayout>) {
    match layout {
        None => out.push_str("null"),
        Some(l) => {
            out.push_str("{\"scalar_type\": ");
            json_string(out, &l.scalar_type().name());
            let _ = write!(
                out,
                ", \"scalar_type_code\": {}, \"sizes\": {}, \"dim_order\": {}, \"nbytes\": {}}}",
                l.scalar_type().code(),
                json_list(l.sizes()),
                json_list(l.dim_order()),
                l.nbytes().map_or("null".to_string(), |n| n.to_string())
            );
        }
    }
}

/// One JSON object: `file`, `kind`, `segments` and `entries`, each entry
/// `{key, segment_index, offset, size, layout}` (+ `sha256` when asked).
pub fn to_json(map: &FileDataMap, with_sha256: bool) -> String {
    let mut out = String::from("{\"file\": ");
    json_string(&mut out, map.source());
    let _ = write!(
        out,
        ", \"kind\": \"{}\", \"segments\": [",
        kind_name(map.kind())
    );
    for (i, &(offset, size)) in map.segments().iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(
            out,
            "{sep}{{\"index\": {i}, \"offset\": {offset}, \"size\": {size}, \"alignment\": {}}}",
            alignment_of(offset)
        );
    }
    out.push_str("], \"entries\": [");
    for (i, e) in map.entries().iter().enumerate() {
        out.push_str(if i == 0 { "{" } else { ", {" });
        out.push_str("\"key\": ");
        json_string(&mut out, &e.key);
        let _ = write!(
            out,
            ", \"segment_index\": {}, \"offset\": {}, \"size\": {}, \"layout\": ",
            e.segment_index, e.offset, e.size
        );
        json_layout(&mut out, e.layout.as_ref());
        if with_sha256 {
            let data = map.get_data(&e.key).expect("listed keys exist");
            let _ = write!(out, ", \"sha256\": \"{}\"", to_hex(&sha256(&data)));
        }
        out.push('}');
    }
    out.push_str("]}");
    out
}

/// A readable listing: one line per segment, one per key.
pub fn to_text(map: &FileDataMap, with_sha256: bool) -> String {
    let mut out = String::new();
    let total: usize = map.segments().iter().map(|s| s.1).sum();
    let _ = writeln!(
        out,
        "{} ({}): {} keys, {} segments, {} bytes of segment data",
        map.source(),
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
