// A C++ caller of whole programs: load a .pte with its .ptd files, initialise a method, run it.
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>

#include "xnnblob/src/ffi.rs.h"
#include "xnnblob-checks/hooks/test_hooks.h"

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
