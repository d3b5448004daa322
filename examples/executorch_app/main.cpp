// A plain ExecuTorch app: it loads a program with the runtime's Module, turns on the XNNPACK
// backend's persistent weight cache with ExecuTorch's own option names, runs one method and writes
// its first output. Nothing here names xnnblob: which XNNPACK backend runs it is decided by the
// link line (see CMakeLists.txt), which is the whole point of a drop-in backend.
//
// usage: executorch_app PROGRAM.pte DATA.ptd|- INPUT.f32 OUTPUT.f32 [CACHE_FILE [BUNDLE_DIR]]
//
// BUNDLE_DIR: packed-weight caches made at build time (xnnblob_prepack in CMakeLists.txt), given
// as xnnblob's packed_cache_layers. A per-load option ExecuTorch's own backend does not read.

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/options.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using executorch::extension::Module;
using executorch::runtime::Error;

namespace {

int fail(const std::string& what, Error e) {
  std::fprintf(stderr, "executorch_app: %s (ExecuTorch error 0x%x)\n", what.c_str(),
               static_cast<unsigned>(e));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 7) {
    std::fprintf(stderr,
                 "usage: executorch_app PROGRAM.pte DATA.ptd|- INPUT.f32 OUTPUT.f32 "
                 "[CACHE_FILE [BUNDLE_DIR]]\n");
    return 2;
  }
  const std::string program = argv[1];
  const std::string data = argv[2];

  // Per load, the route ExecuTorch's own XNNPACK backend reads the cache path from.
  executorch::runtime::BackendOptions<3> options;
  executorch::runtime::LoadBackendOptionsMap per_load;
  if (argc >= 6) {
    options.set_option("weight_cache_enabled", true);
    options.set_option("packed_cache_path", argv[5]);
    if (argc == 7) options.set_option("packed_cache_layers", argv[6]);
    Error e = per_load.set_options("XnnpackBackend", options.view());
    if (e != Error::Ok) return fail("setting the XnnpackBackend options", e);
  }

  Module module = data == "-" ? Module(program, Module::LoadMode::Mmap)
                              : Module(program, data, Module::LoadMode::Mmap);
  Error e = module.load_method("forward", nullptr, nullptr, &per_load);
  if (e != Error::Ok) return fail("loading forward of " + program, e);

  auto meta = module.method_meta("forward");
  if (!meta.ok()) return fail("reading forward's signature", meta.error());
  auto input_meta = meta->input_tensor_meta(0);
  if (!input_meta.ok()) return fail("forward's first input is not a tensor", input_meta.error());

  std::ifstream in(argv[3], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> values(bytes.size() / sizeof(float));
  std::copy(bytes.begin(), bytes.begin() + values.size() * sizeof(float),
            reinterpret_cast<char*>(values.data()));
  std::vector<executorch::aten::SizesType> shape(input_meta->sizes().begin(),
                                                 input_meta->sizes().end());
  auto input = executorch::extension::from_blob(values.data(), shape);
  if (input->nbytes() != values.size() * sizeof(float)) {
    std::fprintf(stderr, "executorch_app: %s holds %zu floats, forward takes %zu\n", argv[3],
                 values.size(), static_cast<size_t>(input->numel()));
    return 1;
  }

  auto outputs = module.forward(input);
  if (!outputs.ok()) return fail("running forward", outputs.error());
  const auto& output = (*outputs)[0].toTensor();
  std::ofstream out(argv[4], std::ios::binary);
  out.write(output.const_data_ptr<char>(), static_cast<std::streamsize>(output.nbytes()));
  if (!out) {
    std::fprintf(stderr, "executorch_app: cannot write %s\n", argv[4]);
    return 1;
  }
  std::printf("forward: %zu outputs, first has %zu elements\n", outputs->size(),
              static_cast<size_t>(output.numel()));
  return 0;
}
