//! xnnblob's verifier of the payload's graph flatbuffer (`xnnblob::schema::xnn_graph`, which
//! every delegate init runs) against the `flatbuffers` crate's generated one, on the graphs of
//! every payload ExecuTorch's exporter wrote here and of every seed of the payload fuzz target,
//! each as it is, with each byte changed and cut short: the two accept exactly the same buffers.
//! The `graph_verifier` fuzz target does the same on what libFuzzer mutates.

use std::path::Path;
use xnnblob::delegate::payload;
use xnnblob::schema::xnn;

/// The graph flatbuffer of each payload found in `bytes`: a whole `.xnn` payload, or a program
/// whose segments hold some (found by their `XH00` header).
fn graphs_in(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(4).position(|w| w == payload::MAGIC) {
        let start = (at + found).wrapping_sub(4);
        at += found + 4;
        if let Some(p) = bytes.get(start..).and_then(|b| payload::parse(b).ok()) {
            let fb = p.header.flatbuffer_offset as usize;
            out.push(&bytes[start + fb..start + fb + p.header.flatbuffer_size as usize]);
        }
    }
    out
}

fn flatbuffers_accepts(fb: &[u8]) -> bool {
    flatbuffers::root_with_opts::<xnn::XNNGraph>(&xnnblob::schema::verifier_options(), fb).is_ok()
}

/// Where the two verifiers disagree on `fb`, or the node-types view (`xnn_node_types`, which
/// checks only what it reads) refuses a graph the full verifier accepts or reads other types
/// from it: None when they agree. The view reads every buffer it is given, accepted or not,
/// within it (the sanitizer run holds it to that).
fn disagreement(fb: &[u8]) -> Option<String> {
    let ours = xnnblob::schema::xnn_graph(fb);
    let theirs = flatbuffers_accepts(fb);
    if ours.is_ok() != theirs {
        return Some(format!(
            "xnnblob: {:?}, flatbuffers accepts: {theirs}",
            ours.err()
        ));
    }
    let view: Option<Vec<_>> = xnnblob::schema::xnn_node_types(fb)
        .ok()
        .map(Iterator::collect);
    let full: Option<Vec<_>> = ours.ok().map(|g| {
        g.xnodes()
            .into_iter()
            .flatten()
            .map(|n| n.xnode_union_type())
            .collect()
    });
    match (full, view) {
        (Some(full), Some(view)) if full != view => Some(format!(
            "node types: the graph's {full:?}, the view's {view:?}"
        )),
        (Some(_), None) => Some("the node-types view refuses a verified graph".into()),
        _ => None,
    }
}

#[test]
fn the_node_types_view_reads_a_graph_whose_other_tables_are_broken() {
    let graph = xnnblob_test_support::synthetic::mlp_payload(
        &xnnblob_test_support::synthetic::Mlp::random(&[8, 4], 1),
        1,
    );
    let p = payload::parse(&graph.payload).unwrap();
    let at = p.header.flatbuffer_offset as usize;
    let mut fb = graph.payload[at..at + p.header.flatbuffer_size as usize].to_vec();
    let types: Vec<_> = xnnblob::schema::xnn_node_types(&fb).unwrap().collect();
    assert_eq!(types, [xnn::XNodeUnion::XNNFullyConnected]);
    // The graph's version string ("0") made other than UTF-8: the graph is refused, its node
    // types are still read.
    let version = fb
        .windows(6)
        .position(|w| w == [1, 0, 0, 0, b'0', 0])
        .unwrap();
    fb[version + 4] = 0xFF;
    assert!(xnnblob::schema::xnn_graph(&fb).is_err());
    assert!(!flatbuffers_accepts(&fb));
    let types: Vec<_> = xnnblob::schema::xnn_node_types(&fb).unwrap().collect();
    assert_eq!(types, [xnn::XNodeUnion::XNNFullyConnected]);
}

#[test]
fn the_graph_verifier_accepts_what_flatbuffers_accepts_and_nothing_else() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["tests/data/executorch/export", "fuzz/corpus/payload"] {
        for entry in std::fs::read_dir(repo.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("pte" | "xnn")
            ) {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut seen = std::collections::HashSet::new();
    let (mut graphs, mut checked, mut refused) = (0, 0usize, 0usize);
    let mut failures = Vec::new();
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        for fb in graphs_in(&bytes) {
            // Exports of one architecture share their graphs' bytes.
            if !seen.insert(fb.to_vec()) {
                continue;
            }
            graphs += 1;
            assert!(
                xnnblob::schema::xnn_graph(fb).is_ok() || !flatbuffers_accepts(fb),
                "{}: a graph flatbuffers accepts is refused",
                path.display()
            );
            // Every byte of a small graph, an even spread of a large one's.
            let step = fb.len().div_ceil(1024).max(1);
            let mut copy = fb.to_vec();
            for i in (0..fb.len()).step_by(step) {
                let b = fb[i];
                for changed in [0x00, 0xFF, b ^ 0x01, b ^ 0x80, b.wrapping_add(4)] {
                    copy[i] = changed;
                    checked += 1;
                    refused += usize::from(!flatbuffers_accepts(&copy));
                    if let Some(d) = disagreement(&copy) {
                        failures.push(format!("{} byte {i} = {changed:#x}: {d}", path.display()));
                    }
                }
                copy[i] = b;
                if let Some(d) = disagreement(&fb[..i]) {
                    failures.push(format!("{} cut at {i}: {d}", path.display()));
                }
            }
        }
    }
    println!("{graphs} graphs, {checked} changed bytes, {refused} of them refused by both");
    assert!(graphs >= 20, "the fixtures hold payloads ({graphs} found)");
    assert!(
        refused > 0 && refused < checked,
        "changes both kept and broke graphs"
    );
    assert!(
        failures.is_empty(),
        "{} disagreements, the first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}
