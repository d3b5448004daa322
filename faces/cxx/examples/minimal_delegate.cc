// A C++ delegate author's view of xnnblob: open a model's named data, initialise the XNNPACK
// delegate from its processed payload, run it. (docs/delegate.md; built and run by the tests.)
#include <cstddef>
#include <utility>
#include <vector>

#include "xnnblob/delegate.h"
#include "xnnblob-checks/hooks/test_hooks.h"

namespace xnnblob {

rust::Vec<float> run_minimal_example(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                     rust::Slice<const float> input) {
  // One per app: the shared data cache, packed-weight caches, workspace and threads of every
  // model and method it loads.
  rust::Box<Backend> backend = new_backend(default_backend_config());

  // Per model: its named data (a .ptd here; a .pte's named data works the same), and its
  // context: packed weights in memory here, or in a file with backend->model("path").
  rust::Box<DataMap> map = open_data_map(ptd_path);
  rust::Box<Model> model = backend->model("");

  // Per lowered method: init consumes the payload, the map and the model.
  delegate::Handle handle = delegate::init(payload, /*compile_specs=*/{}, *map, *model);

  std::size_t elements = 1;
  for (std::size_t d : handle->output_shape(0)) {
    elements *= d;
  }
  std::vector<float> output(elements);
  delegate::execute(handle, {input}, {rust::Slice<float>(output.data(), output.size())});
  delegate::destroy(std::move(handle));

  rust::Vec<float> result;
  for (float v : output) {
    result.push_back(v);
  }
  return result;
}

}  // namespace xnnblob
