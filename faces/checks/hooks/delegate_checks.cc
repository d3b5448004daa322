// C++-side checks of the delegate API, run from faces/checks/tests/faces/cpp_delegate.rs: a C++ NamedDataMap
// consumed by Rust, errors arriving as exceptions with their message, sharing across delegates.
#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xnnblob/delegate.h"
#include "xnnblob/named_data.h"
#include "xnnblob-checks/hooks/test_hooks.h"
#include "xnnblob-checks/src/lib.rs.h"

namespace xnnblob {
namespace {

// A map over blobs copied into std::vectors: what a C++ user's own storage looks like.
class VectorMap : public NamedDataMap {
 public:
  void add(std::string key, std::vector<std::uint8_t> bytes) {
    keys_.push_back(key);
    blobs_[std::move(key)] = std::move(bytes);
  }
  void fail_with(std::string message) { failure_ = std::move(message); }
  void fail_counting_with(std::string message) { count_failure_ = std::move(message); }

  std::size_t num_keys() const override {
    if (!count_failure_.empty()) {
      throw std::runtime_error(count_failure_);
    }
    return keys_.size();
  }
  rust::String key_at(std::size_t index) const override { return rust::String(keys_.at(index)); }
  rust::Slice<const std::uint8_t> get_data(rust::Str key) const override {
    if (!failure_.empty()) {
      throw std::runtime_error(failure_);
    }
    const auto& bytes = blobs_.at(std::string(key));
    return rust::Slice<const std::uint8_t>(bytes.data(), bytes.size());
  }

 private:
  std::vector<std::string> keys_;
  std::map<std::string, std::vector<std::uint8_t>> blobs_;
  std::string failure_;
  std::string count_failure_;
};

void check(bool ok, const std::string& what) {
  if (!ok) {
    throw std::runtime_error("C++ check failed: " + what);
  }
}

// Runs `fn`, which must throw an exception whose message contains `expected`.
template <typename Fn>
void expect_throw(Fn fn, const std::string& expected, const std::string& what) {
  try {
    fn();
  } catch (const std::exception& e) {
    check(std::string(e.what()).find(expected) != std::string::npos,
          what + ": message \"" + e.what() + "\" lacks \"" + expected + "\"");
    return;
  }
  check(false, what + ": no exception");
}

std::vector<float> run(delegate::Handle& handle, rust::Slice<const float> input) {
  std::size_t n = 1;
  for (std::size_t d : handle->output_shape(0)) n *= d;
  std::vector<float> out(n);
  delegate::execute(handle, {input}, {rust::Slice<float>(out.data(), out.size())});
  return out;
}

}  // namespace

std::unique_ptr<HeldDelegate> cpp_make_delegate(rust::Str ptd_path,
                                                rust::Slice<const std::uint8_t> payload) {
  rust::Box<Backend> backend = new_backend(default_backend_config());
  rust::Box<DataMap> map = open_data_map(ptd_path);
  return std::unique_ptr<HeldDelegate>(
      new HeldDelegate{delegate::init(payload, {}, *map, *backend->model(""))});
}

void cpp_execute_f32(HeldDelegate& held, rust::Slice<const float> input,
                     rust::Slice<const std::size_t> shape, rust::Slice<float> output) {
  // What a delegate author writes on a hot path: spans in, spans out, nothing allocated.
  delegate::Input in{delegate::scalar_type::kFloat, shape.data(), shape.size(), input.data(),
                     input.size() * sizeof(float)};
  delegate::Output out{delegate::scalar_type::kFloat, output.data(), output.size() * sizeof(float)};
  delegate::execute(*held.delegate, &in, 1, &out, 1);
}

rust::String cpp_delegate_checks(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                 rust::Slice<const float> input) {
  std::string report;
  rust::Box<DataMap> file_map = open_data_map(ptd_path);
  rust::Box<Backend> backend = new_backend(default_backend_config());
  rust::Box<SharedCache> shared = backend->shared_cache();
  rust::Box<Model> model = backend->model("");
  rust::Box<WeightsCache> weights = model->weights_cache();

  // Two delegates over the same weights: each blob loaded once, each weight packed once.
  delegate::Handle a = delegate::init(payload, {}, *file_map, *model);
  delegate::Handle b = delegate::init(payload, {}, *file_map, *model);
  SharedCacheStats s = shared->stats();
  check(s.inits == file_map->num_keys() - 1, "one load per blob (the slack blob is unused)");
  check(s.hits == s.inits, "the second delegate hit every blob");
  check(weights->stats().packed * 2 == weights->stats().hits + weights->stats().packed,
        "the second delegate packed nothing");
  std::vector<float> expected = run(a, input);
  check(run(b, input) == expected, "both delegates agree");
  report += "shared ok; ";

  // The same model from a C++ map: Rust consumes it through the bridge.
  auto cpp_map = std::make_shared<VectorMap>();
  for (std::size_t i = 0; i < file_map->num_keys(); ++i) {
    rust::String key = file_map->key_at(i);
    rust::Box<Buffer> data = file_map->get_data(std::string(key));
    rust::Slice<const std::uint8_t> bytes = data->data();
    cpp_map->add(std::string(key), std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
  }
  rust::Box<DataMap> from_cpp = data_map_from_cpp(cpp_map, "cpp-map");
  rust::Box<Backend> other = new_backend(default_backend_config());
  delegate::Handle c = delegate::init(payload, {}, *from_cpp, *other->model_without_weights_cache());
  check(run(c, input) == expected, "a C++ map gives the same outputs");
  report += "cpp map ok; ";

  // Errors cross the bridge as exceptions with their message intact.
  std::vector<std::uint8_t> bad(payload.begin(), payload.end());
  bad[4] = 'Z';
  expect_throw([&] { delegate::init({bad.data(), bad.size()}, {}, *file_map, *model); }, "XH00",
               "wrong magic");
  expect_throw([&] { delegate::init({payload.data(), 20}, {}, *file_map, *model); }, "truncated",
               "truncated payload");
  auto empty = std::make_shared<VectorMap>();
  rust::Box<DataMap> empty_map = data_map_from_cpp(empty, "empty-map");
  expect_throw(
      [&] { delegate::init(payload, {}, *empty_map, *new_backend(default_backend_config())->model("")); },
      "not found", "missing constant");
  cpp_map->fail_with("storage offline");
  expect_throw(
      [&] { delegate::init(payload, {}, *from_cpp, *new_backend(default_backend_config())->model("")); },
      "storage offline", "a C++ map's own exception");
  // named_data.h lets every method of a map throw, num_keys too: the bridge declares it
  // fallible, so the throw is data_map_from_cpp's exception rather than std::terminate.
  auto uncountable = std::make_shared<VectorMap>();
  uncountable->fail_counting_with("keys cannot be counted");
  expect_throw([&] { data_map_from_cpp(uncountable, "uncountable-map"); }, "keys cannot be counted",
               "a C++ map's num_keys throwing");
  expect_throw([&] { delegate::execute(a, {}, {}); }, "inputs", "wrong number of inputs");
  // A panic inside the bridge becomes the call's exception, and this process goes on.
  expect_throw([&] { panic_inside_bridge("forced by the check"); },
               "xnnblob panicked: forced by the check", "a panic inside the bridge");
  rust::Vec<std::size_t> in_shape = a->input_shape(0);
  std::vector<float> out(expected.size());
  delegate::Output o{delegate::scalar_type::kFloat, out.data(), out.size() * sizeof(float)};
  delegate::Input short_in{delegate::scalar_type::kFloat, in_shape.data(), in_shape.size(), input.data(),
                           sizeof(float)};
  expect_throw([&] { delegate::execute(*a, &short_in, 1, &o, 1); }, "bytes", "wrong input size");
  delegate::Input half_in{delegate::scalar_type::kHalf, in_shape.data(), in_shape.size(), input.data(),
                          input.size() * sizeof(float)};
  expect_throw([&] { delegate::execute(*a, &half_in, 1, &o, 1); }, "float16", "wrong input dtype");
  expect_throw([&] { file_map->get_data("no-such-key"); }, "no-such-key", "unknown key");
  report += "errors ok; ";

  delegate::destroy(std::move(a));
  delegate::destroy(std::move(b));
  delegate::destroy(std::move(c));
  check(shared->stats().entries == 0, "entries released with the last delegate");
  report += "release ok";
  return rust::String(report);
}

}  // namespace xnnblob
