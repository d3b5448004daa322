// A C++ caller of whole programs: load a .pte with its .ptd files, initialise a method, run it.
#include <cstddef>
#include <string>

#include "xnnblob/src/ffi.rs.h"
#include "xnnblob/xnnblob.h"

namespace xnnblob {

rust::Vec<float> cpp_run_program(rust::Str pte, const rust::Vec<rust::String>& ptds, rust::Str method,
                                 rust::Slice<const float> input) {
  rust::Box<Program> program = load_program(pte, rust::Slice<const rust::String>(ptds.data(), ptds.size()), "");
  rust::Box<Method> m = program->method(method);
  m->set_input(0, input);
  m->execute();
  rust::Slice<const float> out = m->output(0);
  rust::Vec<float> result;
  for (float v : out) {
    result.push_back(v);
  }
  return result;
}

}  // namespace xnnblob
