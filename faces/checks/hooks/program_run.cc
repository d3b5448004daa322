// A C++ caller of whole programs: load a .pte with its .ptd files, initialise a method, run it.
#include <cstddef>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xnnblob/src/ffi.rs.h"
#include "xnnblob-checks/hooks/test_hooks.h"
#include "xnnblob-checks/src/lib.rs.h"

namespace xnnblob {

rust::Vec<float> cpp_run_program(rust::Str pte, const rust::Vec<rust::String>& ptds, rust::Str method,
                                 rust::Slice<const float> input) {
  rust::Box<Backend> backend = new_backend(default_backend_config());
  rust::Box<Program> program =
      load_program(*backend, pte, rust::Slice<const rust::String>(ptds.data(), ptds.size()), "");
  rust::Box<Method> m = program->method(method);
  rust::Vec<std::size_t> shape = m->input_shape(0);
  m->bind_input(0, /*float32*/ 6, rust::Slice<const std::size_t>(shape.data(), shape.size()),
                rust::Slice<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(input.data()),
                                                input.size() * sizeof(float)),
                false);
  m->execute();
  if (m->output_scalar_type(0) != 6) {
    throw std::runtime_error("output 0 is not float32");
  }
  rust::Slice<const std::uint8_t> out = m->output_data(0);
  rust::Vec<float> result;
  for (std::size_t i = 0; i + sizeof(float) <= out.size(); i += sizeof(float)) {
    float v;
    std::memcpy(&v, out.data() + i, sizeof(float));
    result.push_back(v);
  }
  return result;
}

rust::Vec<std::uint8_t> cpp_run_program_raw(rust::Str pte, const rust::Vec<rust::String>& ptds,
                                            rust::Str method, std::int8_t scalar_type,
                                            rust::Slice<const std::size_t> shape,
                                            rust::Slice<const std::uint8_t> input) {
  rust::Box<Backend> backend = new_backend(default_backend_config());
  rust::Box<Program> program =
      load_program(*backend, pte, rust::Slice<const rust::String>(ptds.data(), ptds.size()), "");
  rust::Box<Method> m = program->method(method);
  m->bind_input(0, scalar_type, shape, input, false);
  m->execute();
  if (m->output_scalar_type(0) != scalar_type) {
    throw std::runtime_error("output 0 has another dtype than the input");
  }
  rust::Slice<const std::uint8_t> out = m->output_data(0);
  rust::Vec<std::uint8_t> result;
  for (std::uint8_t b : out) {
    result.push_back(b);
  }
  return result;
}

}  // namespace xnnblob

namespace xnnblob {

CallsRun cpp_run_calls(rust::Str pte, const rust::Vec<rust::String>& ptds,
                       const rust::Vec<rust::String>& methods, rust::Slice<const float> inputs,
                       rust::Str cache_path) {
  rust::Box<Backend> backend = new_backend(default_backend_config());
  rust::Box<Program> program = load_program(
      *backend, pte, rust::Slice<const rust::String>(ptds.data(), ptds.size()), cache_path);
  CallsRun run;
  // What an app would say to its user before running: each buffer the load found frozen.
  for (const FrozenBufferSuspect& s : program->frozen_buffer_suspects()) {
    run.frozen.push_back(s.warning);
  }
  // One Method per name, made once: the program's methods share its mutable buffers, so what
  // one call writes the next one reads.
  std::vector<std::pair<std::string, rust::Box<Method>>> made;
  std::size_t at = 0;
  for (const rust::String& name : methods) {
    std::string key(name);
    auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == key; });
    if (it == made.end()) {
      made.emplace_back(key, program->method(name));
      it = made.end() - 1;
    }
    Method& m = *it->second;
    rust::Vec<std::size_t> shape = m.input_shape(0);
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    if (at + n > inputs.size()) throw std::runtime_error("fewer inputs than the calls take");
    m.bind_input(0, /*float32*/ 6, rust::Slice<const std::size_t>(shape.data(), shape.size()),
                 rust::Slice<const std::uint8_t>(
                     reinterpret_cast<const std::uint8_t*>(inputs.data() + at), n * sizeof(float)),
                 false);
    at += n;
    m.execute();
    rust::Slice<const std::uint8_t> out = m.output_data(0);
    for (std::size_t i = 0; i + sizeof(float) <= out.size(); i += sizeof(float)) {
      float v;
      std::memcpy(&v, out.data() + i, sizeof(float));
      run.outputs.push_back(v);
    }
  }
  rust::Box<WeightsCache> cache = program->weights_cache();
  cache->wait_saved();
  WeightsCacheStats stats = cache->stats();
  run.packed = stats.packed;
  run.hits = stats.hits;
  return run;
}

}  // namespace xnnblob

namespace xnnblob {

rust::Vec<std::size_t> cpp_layered_load(rust::Str pte, const rust::Vec<rust::String>& ptds,
                                        rust::Str method, rust::Str cache_path,
                                        const rust::Vec<rust::String>& layers) {
  BackendConfig config = default_backend_config();
  config.packed_cache_path = rust::String(cache_path.data(), cache_path.size());
  for (const rust::String& layer : layers) config.packed_cache_layers.push_back(layer);
  rust::Box<Backend> backend = new_backend(config);
  rust::Box<Program> program =
      load_program(*backend, pte, rust::Slice<const rust::String>(ptds.data(), ptds.size()), "");
  rust::Box<Method> m = program->method(method);
  // The backend resolves its configured file to the one cache the program packed into.
  WeightsCacheStats stats = backend->model("")->weights_cache()->stats();
  rust::Vec<std::size_t> counts;
  counts.push_back(stats.packed);
  counts.push_back(stats.hits);
  counts.push_back(stats.misses);
  return counts;
}

}  // namespace xnnblob
