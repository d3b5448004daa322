#include "xnnblob/delegate.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace xnnblob::delegate {

Handle init(rust::Slice<const std::uint8_t> processed, const std::vector<CompileSpec>& compile_specs,
            const DataMap& map, const SharedCache& shared, const WeightsCache* weights) {
  rust::Slice<const CompileSpec> specs(compile_specs.data(), compile_specs.size());
  if (weights != nullptr) {
    return delegate_init(processed, specs, map, shared, *weights);
  }
  return delegate_init_without_weights_cache(processed, specs, map, shared);
}

void execute(Handle& handle, const std::vector<rust::Slice<const float>>& inputs,
             const std::vector<rust::Slice<float>>& outputs) {
  if (inputs.size() != handle->num_inputs() || outputs.size() != handle->num_outputs()) {
    throw std::invalid_argument("xnnblob: " + std::to_string(inputs.size()) + " inputs and " +
                                std::to_string(outputs.size()) + " outputs given, the graph has " +
                                std::to_string(handle->num_inputs()) + " and " +
                                std::to_string(handle->num_outputs()));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    handle->set_input(i, inputs[i]);
  }
  handle->execute();
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    rust::Slice<const float> result = handle->output(i);
    if (result.size() != outputs[i].size()) {
      throw std::invalid_argument("xnnblob: output " + std::to_string(i) + " holds " +
                                  std::to_string(result.size()) + " elements, the span " +
                                  std::to_string(outputs[i].size()));
    }
    std::copy(result.begin(), result.end(), outputs[i].begin());
  }
}

void destroy(Handle handle) { (void)std::move(handle); }

}  // namespace xnnblob::delegate
