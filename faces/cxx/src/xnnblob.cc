#include "xnnblob/xnnblob.h"

#include <xnnpack.h>

#include <string>

#include "xnnblob/src/ffi.rs.h"

namespace xnnblob {

rust::String describe() {
  std::string line = "xnnblob ";
  line += std::string(version());
  line += " on XNNPACK build ";
  line += std::string(xnnpack_build_identifier());
  line += " (";
  line += std::to_string(xnn_experimental_get_build_identifier_size());
  line += "-byte identifier)";
  return rust::String(line);
}

}  // namespace xnnblob
