// A memory bank implemented in C++: memory that holds a stateful program's buffers, written by
// xnnblob only through the bank's own copy function.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rust/cxx.h"

namespace xnnblob {

// Contract: base() points to len() bytes, aligned to 64, valid for reads and writes and at a
// fixed address for the bank's whole life; XNNPACK's operators read and write state there
// directly between begin_execute() and end_execute(); xnnblob itself writes only through
// copy_in and reads only through copy_out.
class MemoryBank {
 public:
  virtual ~MemoryBank() = default;
  virtual std::size_t len() const = 0;
  virtual std::uint8_t* base() = 0;
  virtual void copy_in(std::size_t offset, rust::Slice<const std::uint8_t> src) = 0;
  virtual void copy_out(std::size_t offset, rust::Slice<std::uint8_t> dst) = 0;
  virtual void begin_execute() {}
  virtual void end_execute() {}
};

}  // namespace xnnblob
