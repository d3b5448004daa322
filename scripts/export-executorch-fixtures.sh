#!/usr/bin/env bash
# Regenerates tests/data/executorch/export/ with ExecuTorch 1.5.1's exporter (about 6 GB of
# packages, installed once into a venv under the per-user cache). Tests never need this: the
# files are checked in.
#
#   scripts/export-executorch-fixtures.sh [--only NAME,NAME]
#   scripts/export-executorch-fixtures.sh --bench   # the peer bench's full-size programs (about
#       300 MB) into the per-user cache, where `xnnblob-lab bench --peer` finds them
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${XNNBLOB_EXPORT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/xnnblob/export-venv}
if ! "$venv/bin/python" -c 'import executorch, torch, torchao, torchvision' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --progress-bar off \
    executorch==1.5.1 torch==2.14.1 torchao==0.18.0 torchvision==0.29.2
fi
out=tests/data/executorch/export
if [ "${1:-}" = --bench ]; then
  out=${XNNBLOB_BENCH_EXPORTS:-${XDG_CACHE_HOME:-$HOME/.cache}/xnnblob/bench-exports}
fi
"$venv/bin/python" scripts/export-executorch-fixtures.py --out "$out" "$@"
