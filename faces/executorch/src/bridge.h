// The ExecuTorch objects the Rust side of xnnblob's ExecuTorch backend reads through cxx: a
// FreeableBuffer it owns, a method's NamedDataMap it borrows during init, and one delegate
// call's arguments.
#pragma once

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/core/span.h>

#include <cstdint>
#include <memory>

#include "rust/cxx.h"

namespace xnnblob::et {

struct TensorArg;
// ExecuTorch's error codes by name (defined by the bridge, lib.rs).
enum class EtError : std::uint32_t;

// A FreeableBuffer moved out of ExecuTorch; freed (ExecuTorch's Free) on destruction.
class EtBuffer {
 public:
  explicit EtBuffer(executorch::runtime::FreeableBuffer&& buffer);
  const uint8_t* data() const;
  size_t size() const;

 private:
  executorch::runtime::FreeableBuffer buffer_;
};

// A method's NamedDataMap, borrowed for the duration of one init.
class EtDataMap {
 public:
  explicit EtDataMap(const executorch::runtime::NamedDataMap* map);
  uint32_t num_keys() const;
  // The address of ExecuTorch's map: it names the map for as long as its program lives, where
  // this wrapper lives for one init.
  size_t identity() const;
  rust::Str key_at(uint32_t index) const;
  std::unique_ptr<EtBuffer> get_data(rust::Str key, EtError& error) const;

 private:
  const executorch::runtime::NamedDataMap* map_;
};

// One delegate call's arguments: inputs then outputs.
class EtCall {
 public:
  explicit EtCall(executorch::runtime::Span<executorch::runtime::EValue*> args);
  size_t num_args() const;
  bool tensor(size_t index, TensorArg& arg) const;
  EtError resize(size_t index, rust::Slice<const int64_t> sizes, TensorArg& arg);

 private:
  executorch::runtime::Span<executorch::runtime::EValue*> args_;
};

// Whether loading the library registered the backend (false: another took the id first).
bool registered();

}  // namespace xnnblob::et
