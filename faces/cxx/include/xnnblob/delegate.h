// The XNNPACK delegate for C++ delegate authors: init / execute / destroy over xnnblob's
// named-data maps and a backend (shared data cache, packed-weight caches, workspace, threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rust/cxx.h"
#include "xnnblob/src/ffi.rs.h"

namespace xnnblob::delegate {

using Handle = rust::Box<Delegate>;

// ExecuTorch's scalar type codes for the dtypes a delegate binds.
namespace scalar_type {
constexpr std::int8_t kByte = 0;      // uint8 (quantized per tensor)
constexpr std::int8_t kChar = 1;      // int8 (quantized per tensor)
constexpr std::int8_t kInt = 3;       // int32
constexpr std::int8_t kHalf = 5;      // float16
constexpr std::int8_t kFloat = 6;     // float32
constexpr std::int8_t kBFloat16 = 15; // bfloat16
}  // namespace scalar_type

// The most dimensions a tensor has (XNNPACK's limit).
constexpr std::size_t kMaxDims = 6;

// An input, bound in place for one execute. `has_slack`: 16 readable bytes follow the data
// (XNNPACK may read them); without it the delegate copies the input once into its own padded
// buffer.
struct Input {
  std::int8_t scalar_type;
  const std::size_t* sizes;
  std::size_t rank;
  const void* data;
  std::size_t nbytes;
  bool has_slack = false;
};

// An output, bound in place: the delegate writes at most `capacity` bytes and records the shape
// it wrote in `sizes`/`rank`.
struct Output {
  std::int8_t scalar_type;
  void* data;
  std::size_t capacity;
  std::size_t sizes[kMaxDims] = {};
  std::size_t rank = 0;
};

// Validates `processed` (ExecuTorch's XNNPACK payload: XH00 header + XN01 graph), loads its
// constants by key from `map` through the model's backend (each key once per backend), and
// builds the XNNPACK runtime with the model's packed-weight cache and workspace. Throws
// rust::Error with the reason on any failure.
Handle init(rust::Slice<const std::uint8_t> processed, const std::vector<CompileSpec>& compile_specs,
            const DataMap& map, const Model& model);

// Runs the graph on one Input per graph input and one Output per graph output, in ascending
// external id (ExecuTorch's argument order). Inputs may have any shape within the declared one;
// the runtime is reshaped only when a shape changed. Nothing is copied (but inputs without
// slack, once) and nothing is allocated. No output may share memory with an input: XNNPACK
// may write an output before it has read every input (it fuses a copy into the node that
// computes it). Throws rust::Error on a dtype, shape or size mismatch or an XNNPACK failure.
void execute(Delegate& delegate, const Input* inputs, std::size_t num_inputs, Output* outputs,
             std::size_t num_outputs);

// A convenience for fp32 graphs at their declared shapes: one span per input and per output.
void execute(Handle& handle, const std::vector<rust::Slice<const float>>& inputs,
             const std::vector<rust::Slice<float>>& outputs);

// Releases the runtime and this delegate's hold on shared constants.
void destroy(Handle handle);

}  // namespace xnnblob::delegate
