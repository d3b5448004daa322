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
