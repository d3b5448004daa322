// C++ test hooks of xnnblob's own tests (the bridge in src/ffi.rs declares them under the
// test-hooks feature): C++ code that exercises the delegate API the way a delegate author would,
// called from Rust tests. Neither this header nor the code behind it is part of the library.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rust/cxx.h"

namespace xnnblob {

// docs/delegate.md's example: runs a payload over a .ptd through the C++ delegate API.
rust::Vec<float> run_minimal_example(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                     rust::Slice<const float> input);

// C++-side checks of the delegate API (exceptions, C++ maps); returns a report of what passed.
rust::String cpp_delegate_checks(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                 rust::Slice<const float> input);

// The stateful counter with a C++ bank whose copy function counts its calls
// (cpp/tests/stateful_checks.cc); returns a report.
rust::String cpp_stateful_counter(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                  std::uint32_t count_in, std::uint32_t count_out);

struct Delegate;

// A delegate over a .ptd, made the way a delegate author would (a test hook).
rust::Box<Delegate> cpp_make_delegate(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload);

// Runs `delegate` on one fp32 input of `shape` and one output through the span `execute`
// (a test hook: the allocation count of a warm execute from C++).
void cpp_execute_f32(Delegate& delegate, rust::Slice<const float> input,
                     rust::Slice<const std::size_t> shape, rust::Slice<float> output);

// Runs a method on one raw input of any dtype and shape; returns output 0's bytes.
rust::Vec<std::uint8_t> cpp_run_program_raw(rust::Str pte, const rust::Vec<rust::String>& ptds,
                                            rust::Str method, std::int8_t scalar_type,
                                            rust::Slice<const std::size_t> shape,
                                            rust::Slice<const std::uint8_t> input);

// Runs a method of an ExecuTorch program through the bridge (cpp/tests/program_run.cc).
rust::Vec<float> cpp_run_program(rust::Str pte, const rust::Vec<rust::String>& ptds, rust::Str method,
                                 rust::Slice<const float> input);

}  // namespace xnnblob
