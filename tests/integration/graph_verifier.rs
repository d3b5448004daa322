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

/// Where the two verifiers disagree on `fb`: None when they agree.
fn disagreement(fb: &[u8]) -> Option<String> {
    let ours = xnnblob::schema::xnn_graph(fb);
    let theirs = flatbuffers_accepts(fb);
    (ours.is_ok() != theirs)
        .then(|| format!("xnnblob: {:?}, flatbuffers accepts: {theirs}", ours.err()))
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
