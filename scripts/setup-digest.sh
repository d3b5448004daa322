#!/usr/bin/env bash
# Prints a digest of the committed files that decide whether a new machine can build and test
# this project (scripts/, build.rs, Cargo.toml, sys/, README.md, and the other crates'
# manifests and build scripts). fresh-machine-check.sh
# records it in .ci/fresh-machine-check.passed; .ci/run compares it to skip an unneeded check.
#   scripts/setup-digest.sh [COMMIT]   (default HEAD)
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-tree -r "${1:-HEAD}" -- scripts build.rs Cargo.toml cli/Cargo.toml lab/Cargo.toml link/Cargo.toml test-support/Cargo.toml sys README.md \
  faces/executorch/build.rs faces/executorch/Cargo.toml faces/cxx/build.rs faces/cxx/Cargo.toml \
  faces/capi/build.rs faces/capi/Cargo.toml faces/checks/build.rs faces/checks/Cargo.toml |
  sha256sum | cut -d' ' -f1
