//! xnnblob's integration tests, in one binary: XNNPACK is linked once, not once per file. Each
//! module is one area (the former `tests/<area>.rs`); run one with
//! `cargo test --test integration <area>::`. Two stay binaries of their own:
//! `execute_allocations` installs a counting global allocator, which would count every other
//! test's allocations here, and `fuzz_short` builds and runs the fuzz targets (minutes).

use xnnblob_test_support as common;

mod aarch64;
mod aarch64_kernels;
mod backend;
mod background_saves;
mod cache_budget;
mod cache_layers;
// Reads the kernel's account of resident pages, which qemu-user does not give: host only.
mod cold_residency;
// Runs this binary under emulated x86-64 CPUs (and builds the library for aarch64): host only.
#[cfg(target_arch = "x86_64")]
mod cpu_identity;
mod deferred_constants;
mod delegate;
mod delegate_fixtures;
mod error_reports;
mod exported_programs;
mod features;
mod fp16_graphs;
mod fuzz_regressions;
mod graph_verifier;
mod identity;
mod key_trust;
mod lying_cache_files;
mod mutated_inputs;
mod named_blob_store;
mod named_data_bad_input;
mod named_data_fixtures;
mod operators;
mod packed_cache;
mod packed_cache_ops;
mod packers;
mod parallel_packing;
mod program_fixtures;
mod program_writer;
mod read_only_damage;
mod remembered_identities;
mod runtime_c;
mod save_faults;
mod shared_data;
mod shared_state;
mod side_files;
mod stateful;
mod threadpool;
mod truncated_cache;
mod weights_cache_provider;
mod xnnpack_mlp;
mod xnnpack_ops;
