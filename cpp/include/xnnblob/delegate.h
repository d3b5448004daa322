// The XNNPACK delegate for C++ delegate authors: init / execute / destroy over xnnblob's
// named-data maps, backend-wide shared data cache and packed-weight cache.
#pragma once

#include <cstdint>
#include <vector>

#include "rust/cxx.h"
#include "xnnblob/src/ffi.rs.h"

namespace xnnblob::delegate {

using Handle = rust::Box<Delegate>;

// Validates `processed` (ExecuTorch's XNNPACK payload: XH00 header + XN01 graph), loads its
// constants by key from `map` through `shared` (each key once per backend), and builds the
// XNNPACK runtime with packed weights from `weights` (null: XNNPACK packs privately). Throws
// rust::Error with the reason on any failure.
Handle init(rust::Slice<const std::uint8_t> processed, const std::vector<CompileSpec>& compile_specs,
            const DataMap& map, const SharedCache& shared, const WeightsCache* weights);

// Runs the graph: one fp32 span per input and per output, in the payload's order, each of the
// size its shape needs. Throws rust::Error on a size mismatch or an XNNPACK failure.
void execute(Handle& handle, const std::vector<rust::Slice<const float>>& inputs,
             const std::vector<rust::Slice<float>>& outputs);

// Releases the runtime and this delegate's hold on shared constants.
void destroy(Handle handle);

}  // namespace xnnblob::delegate
