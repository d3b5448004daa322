#include "xnnblob/delegate.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace xnnblob::delegate {

Handle init(rust::Slice<const std::uint8_t> processed, const std::vector<CompileSpec>& compile_specs,
            const DataMap& map, const Model& model) {
  rust::Slice<const CompileSpec> specs(compile_specs.data(), compile_specs.size());
  return delegate_init(processed, specs, map, model);
}

void execute(Delegate& delegate, const Input* inputs, std::size_t num_inputs, Output* outputs,
             std::size_t num_outputs) {
  if (num_inputs != delegate.num_inputs() || num_outputs != delegate.num_outputs()) {
    throw std::invalid_argument("xnnblob: " + std::to_string(num_inputs) + " inputs and " +
                                std::to_string(num_outputs) + " outputs given, the graph has " +
                                std::to_string(delegate.num_inputs()) + " and " +
                                std::to_string(delegate.num_outputs()));
  }
  // Bindings live only until execute returns, within this call: the buffers stay valid.
  for (std::size_t i = 0; i < num_inputs; ++i) {
    const Input& in = inputs[i];
    delegate.bind_input(i, in.scalar_type, rust::Slice<const std::size_t>(in.sizes, in.rank),
                        rust::Slice<const std::uint8_t>(static_cast<const std::uint8_t*>(in.data), in.nbytes),
                        in.has_slack);
  }
  for (std::size_t i = 0; i < num_outputs; ++i) {
    Output& out = outputs[i];
    delegate.bind_output(i, out.scalar_type,
                         rust::Slice<std::uint8_t>(static_cast<std::uint8_t*>(out.data), out.capacity));
  }
  delegate.execute();
  for (std::size_t i = 0; i < num_outputs; ++i) {
    outputs[i].rank = delegate.output_shape_into(i, rust::Slice<std::size_t>(outputs[i].sizes, kMaxDims));
  }
}

void execute(Handle& handle, const std::vector<rust::Slice<const float>>& inputs,
             const std::vector<rust::Slice<float>>& outputs) {
  Delegate& d = *handle;
  if (inputs.size() != d.num_inputs() || outputs.size() != d.num_outputs()) {
    throw std::invalid_argument("xnnblob: " + std::to_string(inputs.size()) + " inputs and " +
                                std::to_string(outputs.size()) + " outputs given, the graph has " +
                                std::to_string(d.num_inputs()) + " and " +
                                std::to_string(d.num_outputs()));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    rust::Vec<std::size_t> shape = d.input_shape(i);
    d.bind_input(i, scalar_type::kFloat, rust::Slice<const std::size_t>(shape.data(), shape.size()),
                 rust::Slice<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(inputs[i].data()),
                                                 inputs[i].size() * sizeof(float)),
                 false);
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    d.bind_output(i, scalar_type::kFloat,
                  rust::Slice<std::uint8_t>(reinterpret_cast<std::uint8_t*>(outputs[i].data()),
                                            outputs[i].size() * sizeof(float)));
  }
  d.execute();
}

void destroy(Handle handle) { (void)std::move(handle); }

}  // namespace xnnblob::delegate
