// xnnblob's C++ face. The bridge's generated declarations live in "xnnblob/src/ffi.rs.h".
#pragma once

#include "rust/cxx.h"

namespace xnnblob {

// One line naming the xnnblob version and the XNNPACK it runs on (C++ and Rust both reached).
rust::String describe();

}  // namespace xnnblob
