// A C++ user of stateful programs: its own memory bank (aligned heap memory, a copy function that
// counts its calls), a counter whose initial value comes from named data.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "xnnblob/memory_bank.h"
#include "xnnblob/src/ffi.rs.h"
#include "xnnblob-checks/hooks/test_hooks.h"

namespace xnnblob {
namespace {

class CountingBank : public MemoryBank {
 public:
  CountingBank(std::size_t len, std::size_t* copies)
      : len_(len), memory_(static_cast<std::uint8_t*>(std::aligned_alloc(64, (len + 63) / 64 * 64))),
        copies_(copies) {}
  ~CountingBank() override { std::free(memory_); }
  std::size_t len() const override { return len_; }
  std::uint8_t* base() override { return memory_; }
  void copy_in(std::size_t offset, rust::Slice<const std::uint8_t> src) override {
    ++*copies_;
    std::memcpy(memory_ + offset, src.data(), src.size());
  }
  void copy_out(std::size_t offset, rust::Slice<std::uint8_t> dst) override {
    std::memcpy(dst.data(), memory_ + offset, dst.size());
  }

 private:
  std::size_t len_;
  std::uint8_t* memory_;
  std::size_t* copies_;
};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("C++ stateful check failed: " + what);
}

}  // namespace

rust::String cpp_stateful_counter(rust::Str ptd_path, rust::Slice<const std::uint8_t> payload,
                                  std::uint32_t count_in, std::uint32_t count_out) {
  rust::Box<DataMap> map = open_data_map(ptd_path);
  rust::Box<StatefulBuilder> builder = new_stateful_builder();
  rust::Vec<std::size_t> shape;
  shape.push_back(1);
  builder->declare(StateDecl{"count", shape, 0, "count_init"});
  builder->add_method("tick", payload);
  builder->bind("tick", count_in, "count", false);
  builder->bind("tick", count_out, "count", true);
  rust::Box<Backend> backend = new_backend(default_backend_config());
  rust::Box<Stateful> program = builder->build(*map, *backend->model(""));

  std::size_t copies = 0;
  rust::Box<InstanceBuilder> ib = program->instance_builder();
  for (std::size_t size : program->bank_sizes()) {
    ib->add_bank(std::make_unique<CountingBank>(size, &copies));
  }
  rust::Box<StatefulInstance> instance = ib->finish();
  check(copies == 1, "initial value copied in once, through the bank's copy function");
  for (float expected : {6.0f, 7.0f, 8.0f}) {
    rust::Vec<float> out = instance->run("tick", {}, {});
    check(out.size() == 1 && out[0] == expected, "tick gives " + std::to_string(expected));
  }
  check(copies == 1, "running copies nothing through the runtime");
  instance->reset();
  check(copies == 2 && instance->read_state("count")[0] == 5.0f, "reset through the copy function");
  return rust::String("counter ok");
}

}  // namespace xnnblob
