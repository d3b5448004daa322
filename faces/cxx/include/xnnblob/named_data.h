// A named-data map implemented in C++, for xnnblob to consume (through data_map_from_cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "rust/cxx.h"

namespace xnnblob {

// Implement this to hand xnnblob data that lives in your own storage.
//
// Contract: every method may be called from any thread, concurrently; the bytes returned by
// get_data must stay valid and unchanged for as long as the map lives (xnnblob keeps the map
// alive through its shared_ptr while it uses them). Throw on failure: the message reaches the
// caller as a typed error in Rust or an exception in C++.
class NamedDataMap {
 public:
  virtual ~NamedDataMap() = default;
  virtual std::size_t num_keys() const = 0;
  virtual rust::String key_at(std::size_t index) const = 0;
  virtual rust::Slice<const std::uint8_t> get_data(rust::Str key) const = 0;
};

}  // namespace xnnblob
