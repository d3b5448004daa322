// A C++ program on xnnblob's delegate API, built against an installed xnnblob: loads an
// ExecuTorch program and its .ptd, runs `forward` on a raw float32 input, with packed weights
// kept in a cache file (the first run packs, later runs find them packed).
//
//   cpp_delegate PROGRAM.pte DATA.ptd INPUT.f32 CACHE_FILE
//     prints "packed=N hits=M" and the outputs (as exact hex floats)
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <vector>

#include "xnnblob/delegate.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: cpp_delegate PROGRAM.pte DATA.ptd INPUT.f32 CACHE_FILE\n");
    return 2;
  }
  try {
    std::ifstream in(argv[3], std::ios::binary);
    std::vector<char> input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

    rust::Box<xnnblob::Backend> backend = xnnblob::new_backend(xnnblob::default_backend_config());
    rust::Vec<rust::String> data;
    data.push_back(rust::String(argv[2]));
    rust::Box<xnnblob::Program> program =
        xnnblob::load_program(*backend, argv[1], rust::Slice<const rust::String>(data.data(), data.size()),
                              argv[4]);
    rust::Box<xnnblob::Method> forward = program->method("forward");
    rust::Vec<std::size_t> shape = forward->input_shape(0);
    forward->bind_input(0, /*float32*/ 6,
                        rust::Slice<const std::size_t>(shape.data(), shape.size()),
                        rust::Slice<const std::uint8_t>(
                            reinterpret_cast<const std::uint8_t*>(input.data()), input.size()),
                        false);
    forward->execute();

    // The file cache is one per path in a process: this is the one the program used.
    xnnblob::WeightsCacheStats stats = xnnblob::open_weights_cache(argv[4])->stats();
    std::printf("packed=%zu hits=%zu\n", stats.packed, stats.hits);
    rust::Slice<const std::uint8_t> out = forward->output_data(0);
    for (std::size_t i = 0; i + sizeof(float) <= out.size(); i += sizeof(float)) {
      float v;
      std::memcpy(&v, out.data() + i, sizeof(float));
      std::printf("%a\n", static_cast<double>(v));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpp_delegate: %s\n", e.what());
    return 1;
  }
  return 0;
}
