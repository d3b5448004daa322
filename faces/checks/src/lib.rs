//! Checks of xnnblob's C and C++ faces from their own languages. The C++ in `hooks/` (and the
//! documented example, `faces/cxx/examples/minimal_delegate.cc`) uses the C++ delegate API as a
//! delegate author would; the C in `hooks/` and `examples/c_xnnpack` uses the C ABI. This crate
//! declares that code to Rust, so that its tests (`tests/faces`) drive it, and adds the two
//! entry points that force a panic inside each face's guard. Nothing here ships.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

// Named so that they are linked: the C and C++ code calls into both faces.
extern crate xnnblob_capi;
extern crate xnnblob_cxx;

#[cxx::bridge(namespace = "xnnblob")]
mod bridge {
    /// What [`cpp_run_calls`] saw from C++: the calls' outputs, the program's packed-weight
    /// cache, and what its load found frozen.
    struct CallsRun {
        /// Every call's output 0, one after the other.
        outputs: Vec<f32>,
        /// Weights this launch packed into the program's cache.
        packed: usize,
        /// Look-ups that found packed weights in it.
        hits: usize,
        /// The warning of each shared buffer the load found frozen into a delegate.
        frozen: Vec<String>,
    }

    extern "Rust" {
        /// Panics with `message` inside the C++ face's guard: the call throws `rust::Error`
        /// naming the panic, and the process goes on.
        fn panic_inside_bridge(message: &str) -> Result<()>;
    }

    unsafe extern "C++" {
        include!("xnnblob-checks/hooks/test_hooks.h");

        /// A delegate made and held by C++.
        type HeldDelegate;

        /// docs/delegate.md's example (faces/cxx/examples/minimal_delegate.cc).
        fn run_minimal_example(ptd_path: &str, payload: &[u8], input: &[f32]) -> Result<Vec<f32>>;
        /// C++ checks of the delegate API (hooks/delegate_checks.cc): returns a report.
        fn cpp_delegate_checks(ptd_path: &str, payload: &[u8], input: &[f32]) -> Result<String>;
        /// The stateful counter, from C++ with a C++ bank (hooks/stateful_checks.cc).
        fn cpp_stateful_counter(
            ptd_path: &str,
            payload: &[u8],
            count_in: u32,
            count_out: u32,
        ) -> Result<String>;
        /// A delegate made from C++ over a `.ptd` (a backend and in-memory packed weights of its
        /// own).
        fn cpp_make_delegate(ptd_path: &str, payload: &[u8]) -> Result<UniquePtr<HeldDelegate>>;
        /// Runs `delegate` on one fp32 input and output through the C++ span `execute`
        /// (hooks/delegate_checks.cc), as a delegate author would, warm.
        fn cpp_execute_f32(
            delegate: Pin<&mut HeldDelegate>,
            input: &[f32],
            shape: &[usize],
            output: &mut [f32],
        ) -> Result<()>;
        /// Runs a program's method from C++ on one raw input of any dtype and shape; returns
        /// output 0's bytes (hooks/program_run.cc).
        fn cpp_run_program_raw(
            pte: &str,
            ptds: &Vec<String>,
            method: &str,
            scalar_type: i8,
            shape: &[usize],
            input: &[u8],
        ) -> Result<Vec<u8>>;
        /// Loads a program from C++ with its packed weights in the file `cache_path` (empty:
        /// in memory) and runs a sequence of calls on it, each method made once, each call
        /// taking its one fp32 input from `inputs` in turn; waits for the cache's save
        /// (hooks/program_run.cc).
        fn cpp_run_calls(
            pte: &str,
            ptds: &Vec<String>,
            methods: &Vec<String>,
            inputs: &[f32],
            cache_path: &str,
        ) -> Result<CallsRun>;
        /// Loads a program from C++ with a backend whose config names the cache file
        /// `cache_path` under the read-only `layers`, initialises `method` (which packs), and
        /// returns the cache's [packed, hits, misses] (hooks/program_run.cc).
        fn cpp_layered_load(
            pte: &str,
            ptds: &Vec<String>,
            method: &str,
            cache_path: &str,
            layers: &Vec<String>,
        ) -> Result<Vec<usize>>;
        /// Runs a program's method from C++ (hooks/program_run.cc).
        fn cpp_run_program(
            pte: &str,
            ptds: &Vec<String>,
            method: &str,
            input: &[f32],
        ) -> Result<Vec<f32>>;
    }
}

pub use bridge::{
    CallsRun, HeldDelegate, cpp_delegate_checks, cpp_execute_f32, cpp_layered_load,
    cpp_make_delegate, cpp_run_calls, cpp_run_program, cpp_run_program_raw, cpp_stateful_counter,
    run_minimal_example,
};

fn panic_inside_bridge(message: &str) -> Result<(), xnnblob_cxx::Reported> {
    xnnblob_cxx::guarded(|| panic!("{message}"))
}

/// Panics inside the guard every C entry point runs in: the check of the C ABI's panic policy.
#[unsafe(no_mangle)]
pub extern "C" fn xnnblob_checks_panic_inside_guard() -> xnnblob_capi::capi::XnnblobStatus {
    xnnblob_capi::capi::guarded(|| panic!("forced by the check"))
}
