#!/usr/bin/env bash
# The linker scripts/test.sh sanitize gives rustc for test programs: the system's cc, with the
# sanitizers' runtimes named first, so that they come first in the program's library list (where
# ASan's allocator must be to take malloc's place). rustc links with -nodefaultlibs, which keeps
# cc's own -fsanitize from adding them.
set -euo pipefail
exec "${XNNBLOB_SANITIZE_CC:-cc}" -Wl,--push-state,--no-as-needed -lasan -lubsan -Wl,--pop-state "$@"
