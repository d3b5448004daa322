//! The verifier of the XNNPACK payload's graph flatbuffer that every delegate init runs
//! (`xnnblob::schema::xnn_graph`, driven by the schema's shapes) against the `flatbuffers`
//! crate's generated verifier, on arbitrary bytes: both must accept exactly the same buffers,
//! and a graph xnnblob accepts must read back whole through the generated readers (its `Debug`
//! reads every field of every table and union variant it reaches). The node-types view
//! (`xnnblob::schema::xnn_node_types`, which checks only what it reads) reads every buffer
//! within it, and reads a graph xnnblob accepts with the graph's own node types.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xnnblob::schema::xnn::XNNGraph;

fuzz_target!(|data: &[u8]| {
    let opts = xnnblob::schema::verifier_options();
    let ours = xnnblob::schema::xnn_graph(data);
    let theirs = flatbuffers::root_with_opts::<XNNGraph>(&opts, data);
    assert_eq!(
        ours.is_ok(),
        theirs.is_ok(),
        "xnnblob: {:?}; flatbuffers: {:?}",
        ours.as_ref().err(),
        theirs.as_ref().err()
    );
    let view: Option<Vec<_>> = xnnblob::schema::xnn_node_types(data)
        .ok()
        .map(Iterator::collect);
    if let Ok(graph) = ours {
        std::hint::black_box(format!("{graph:?}"));
        let types: Vec<_> = graph
            .xnodes()
            .into_iter()
            .flatten()
            .map(|n| n.xnode_union_type())
            .collect();
        assert_eq!(view, Some(types), "the node-types view of a verified graph");
    }
});
