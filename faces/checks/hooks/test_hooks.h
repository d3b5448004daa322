// C++ checks of xnnblob's C++ face (declared to Rust by faces/checks/src/lib.rs): C++ code that
// exercises the delegate API the way a delegate author would, called from Rust tests. Neither
// this header nor the code behind it is part of any library xnnblob ships.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "rust/cxx.h"
#include "xnnblob/src/ffi.rs.h"

namespace xnnblob {

// docs/delegate.md's example: runs a payload over a .ptd through the C++ delegate API.
rust::Vec<float> run_minimal_example(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                     rust::Slice<const float> input);

// C++-side checks of the delegate API (exceptions, C++ maps); returns a report of what passed.
rust::String cpp_delegate_checks(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                 rust::Slice<const float> input);

// The stateful counter with a C++ bank whose copy function counts its calls
// (stateful_checks.cc); returns a report.
rust::String cpp_stateful_counter(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                  std::uint32_t count_in, std::uint32_t count_out);

// A delegate held by C++, as a delegate author holds one.
struct HeldDelegate {
  rust::Box<Delegate> delegate;
};

// A delegate over a .ptd, made the way a delegate author would.
std::unique_ptr<HeldDelegate> cpp_make_delegate(rust::Str ptd_path,
                                                rust::Slice<const std::uint8_t> payload);

// Runs `held` on one fp32 input of `shape` and one output through the span `execute` (the
// allocation count of a warm execute from C++).
void cpp_execute_f32(HeldDelegate& held, rust::Slice<const float> input,
                     rust::Slice<const std::size_t> shape, rust::Slice<float> output);

// Runs a method on one raw input of any dtype and shape; returns output 0's bytes.
rust::Vec<std::uint8_t> cpp_run_program_raw(rust::Str pte, const rust::Vec<rust::String>& ptds,
                                            rust::Str method, std::int8_t scalar_type,
                                            rust::Slice<const std::size_t> shape,
                                            rust::Slice<const std::uint8_t> input);

// Runs a method of an ExecuTorch program through the bridge (program_run.cc).
rust::Vec<float> cpp_run_program(rust::Str pte, const rust::Vec<rust::String>& ptds, rust::Str method,
                                 rust::Slice<const float> input);

// Defined by the bridge (faces/checks/src/lib.rs).
struct CallsRun;

// Runs calls of methods, in order, on one program loaded with its packed weights in the file
// `cache_path` (empty: in memory), whose methods share its mutable buffers: each call's one fp32
// input taken from `inputs` in turn. Returns the calls' outputs 0 one after the other, the
// cache's counters once its save is done, and the load's frozen-buffer warnings (program_run.cc).
CallsRun cpp_run_calls(rust::Str pte, const rust::Vec<rust::String>& ptds,
                       const rust::Vec<rust::String>& methods, rust::Slice<const float> inputs,
                       rust::Str cache_path);

// Loads a program with a backend configured with the cache file `cache_path` under the read-only
// `layers`, initialises `method`, and returns the cache's packed, hits and misses
// (program_run.cc).
rust::Vec<std::size_t> cpp_layered_load(rust::Str pte, const rust::Vec<rust::String>& ptds,
                                        rust::Str method, rust::Str cache_path,
                                        const rust::Vec<rust::String>& layers);

}  // namespace xnnblob
