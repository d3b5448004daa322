//! The flatbuffer schemas xnnblob reads and writes (ExecuTorch's program and `.ptd`, and the
//! XNNPACK delegate's payload), as flatc generates them from `schema/*.fbs` with
//! `scripts/gen-flatbuffers.sh` (do not edit). Public for writers of test programs and payloads.

#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    dead_code,
    unused_imports,
    unsafe_op_in_unsafe_fn,
    mismatched_lifetime_syntaxes
)]
#[rustfmt::skip]
#[path = "flat_tensor_generated.rs"]
mod flat_tensor_generated;

#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    dead_code,
    unused_imports,
    unsafe_op_in_unsafe_fn,
    mismatched_lifetime_syntaxes
)]
#[rustfmt::skip]
#[path = "program_generated.rs"]
mod program_generated;

#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    dead_code,
    unused_imports,
    non_camel_case_types,
    unsafe_op_in_unsafe_fn,
    mismatched_lifetime_syntaxes
)]
#[rustfmt::skip]
#[path = "xnnpack_generated.rs"]
mod xnnpack_generated;

pub use flat_tensor_generated::xnnblob_fb::ptd;
pub use program_generated::xnnblob_fb::pte;
#[cfg(feature = "xnnpack")]
pub use xnnpack_generated::xnnblob_fb::xnn;

pub mod verify;

/// The limits every flatbuffer xnnblob reads is verified under (`.pte`, `.ptd`, delegate
/// payloads): generous for real programs (thousands of keys), bounded for hostile input.
pub fn verifier_options() -> flatbuffers::VerifierOptions {
    flatbuffers::VerifierOptions {
        max_depth: 64,
        max_tables: 10_000_000,
        max_apparent_size: 1 << 31,
        ignore_missing_null_terminator: false,
    }
}
#[cfg(feature = "xnnpack")]
mod xnn_shape;

/// The graph of an XNNPACK payload (`XN01`), verified: [`verify::verify`] checks `bytes`
/// against the schema's shapes, then the generated readers read them.
#[cfg(feature = "xnnpack")]
pub fn xnn_graph(bytes: &[u8]) -> Result<xnn::XNNGraph<'_>, verify::VerifyError> {
    verify::verify(bytes, &xnn_shape::GRAPH, &verifier_options())?;
    // SAFETY: `verify` checked `bytes` as flatbuffers' verifier for `XNNGraph` checks it (every
    // offset, vtable, vector and string in range and aligned, strings UTF-8, known union
    // variants), against shapes a test holds to the schema the readers were generated from,
    // and the `graph_verifier` fuzz target holds the two verifiers to the same answers.
    Ok(unsafe { flatbuffers::root_unchecked::<xnn::XNNGraph>(bytes) })
}

/// Each node's type in the graph of an XNNPACK payload (`XN01`), with only what that reads
/// verified: the root table, its vector of nodes and each node's type byte
/// (`xnn_shape::GRAPH_NODE_TYPES`). A buffer this reads may still be one [`xnn_graph`] refuses;
/// the graph itself is never handed out, since nothing else of it was checked.
#[cfg(feature = "xnnpack")]
pub fn xnn_node_types(
    bytes: &[u8],
) -> Result<impl Iterator<Item = xnn::XNodeUnion> + '_, verify::VerifyError> {
    verify::verify(bytes, &xnn_shape::GRAPH_NODE_TYPES, &verifier_options())?;
    // SAFETY: `verify` checked the root offset, the root table's vtable, its `xnodes` vector and
    // every node's vtable and type byte in range and aligned, as flatbuffers' verifier checks
    // them; the iterator reads those and nothing else (`xnodes`, `xnode_union_type`).
    let graph = unsafe { flatbuffers::root_unchecked::<xnn::XNNGraph>(bytes) };
    Ok(graph
        .xnodes()
        .into_iter()
        .flatten()
        .map(|node| node.xnode_union_type()))
}
