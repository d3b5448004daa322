// xnnblob's C++ face: functions implemented in C++ that Rust calls (the bridge in src/ffi.rs).
// For the delegate API, include "xnnblob/delegate.h". The C++ checks of this face live in
// faces/checks, outside the library.
#pragma once

#include <cstdint>

#include "rust/cxx.h"

namespace xnnblob {

// One line naming the xnnblob version and the XNNPACK it runs on (C++ and Rust both reached).
rust::String describe();

}  // namespace xnnblob
