#!/usr/bin/env bash
# Issue 30's campaign against the drop-in backend inside ExecuTorch's runtime (xnnblob-et-run),
# on ExecuTorch-exported programs, both data loaders. Prints one line per item and a summary;
# exits 1 if a promise broke.
#   damage:     FLIPS single-byte flips in the packed bytes of a warm file, per program: the
#               launch that meets one may be wrong (counted), the next launch must be right,
#               and a launch with --verify-on-load must be right at once;
#   lock:       another process holds PATH.lock: the launch must exit within 30 s;
#   truncation: the cache file cut to 0, to half and by 4 KiB between two executes, ROUNDS
#               times each: the process must not die of SIGBUS, and the next launch must be right;
#   disk full:  the cache on a 1 MiB tmpfs (root only): right outputs, the save failure said;
#   foreign:    a user's file and the program's own .ptd at the cache path: never replaced.
# Usage: scripts/et-reliability-campaign.sh [FLIPS=100] [ROUNDS=3] (as environment variables)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flips=${FLIPS:-100}
rounds=${ROUNDS:-3}
runner=$root/target/release/xnnblob-et-run
if [ ! -x "$runner" ]; then
  (cd "$root" && cargo build --release -p xnnblob-executorch --bin xnnblob-et-run)
fi
work=$(mktemp -d /tmp/xnnblob-campaign.XXXXXX)
cleanup() {
  umount "$work/full" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
data=$root/tests/data/executorch/export
programs=(arch_mobilenet_v3_int8 arch_resnet_int8 arch_vit_fp32 arch_mobilenet_v2_fp32)
broken=0

# Runs program $1 with cache $2 into output dir $3, loader $4, then any extra arguments; its
# exit status is the runner's.
launch() {
  local p=$1 cache=$2 out=$3 mode=$4
  shift 4
  mkdir -p "$out"
  "$runner" "$data/$p.pte" --data "$data/$p.ptd" --input "$data/$p.s0.in0.bin" \
    --load-mode "$mode" --cache "$cache" --output-dir "$out" "$@" >"$out.stdout" 2>"$out.stderr"
}

# Flips the byte at offset $2 of file $1.
flip() {
  local value
  value=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf %o $((value ^ 0x5a)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# The offset where the index starts (the first field of the 48-byte trailer).
index_offset() {
  local len
  len=$(stat -c %s "$1")
  od -An -tu8 -j $((len - 48)) -N8 "$1" | tr -d ' '
}

echo "== damage: $flips flips per program"
for p in "${programs[@]}"; do
  for mode in file mmap; do
    launch "$p" "$work/good.xbc" "$work/cold" "$mode"
    first_wrong=0 second_wrong=0 verified_wrong=0 failed=0
    end=$(index_offset "$work/good.xbc")
    for ((i = 0; i < flips; i++)); do
      at=$((128 + (RANDOM * 32768 + RANDOM) % (end - 128)))
      cp "$work/good.xbc" "$work/w.xbc"
      flip "$work/w.xbc" "$at"
      cp "$work/w.xbc" "$work/v.xbc"
      launch "$p" "$work/w.xbc" "$work/first" "$mode" || failed=$((failed + 1))
      cmp -s "$work/cold/output0.f32" "$work/first/output0.f32" || first_wrong=$((first_wrong + 1))
      launch "$p" "$work/w.xbc" "$work/second" "$mode" || failed=$((failed + 1))
      cmp -s "$work/cold/output0.f32" "$work/second/output0.f32" || second_wrong=$((second_wrong + 1))
      launch "$p" "$work/v.xbc" "$work/verified" "$mode" --verify-on-load || failed=$((failed + 1))
      cmp -s "$work/cold/output0.f32" "$work/verified/output0.f32" ||
        verified_wrong=$((verified_wrong + 1))
    done
    echo "$p $mode: wrong first launches $first_wrong, wrong second launches $second_wrong," \
      "wrong verify_on_load launches $verified_wrong, failed launches $failed"
    [ "$second_wrong" = 0 ] && [ "$verified_wrong" = 0 ] && [ "$failed" = 0 ] || broken=1
    rm -f "$work/good.xbc"
  done
done

echo "== lock: another process holds the writer lock"
hangs=0
for p in "${programs[@]}"; do
  rm -f "$work/l.xbc"
  flock "$work/l.xbc.lock" sleep 60 &
  holder=$!
  sleep 0.2
  start=$(date +%s%N)
  status=0
  timeout 30 "$runner" "$data/$p.pte" --data "$data/$p.ptd" --input "$data/$p.s0.in0.bin" \
    --cache "$work/l.xbc" >/dev/null 2>"$work/lock.stderr" || status=$?
  took=$((($(date +%s%N) - start) / 1000000))
  [ "$status" = 124 ] && hangs=$((hangs + 1))
  [ "$status" = 0 ] || echo "$p: exit status $status: $(tail -1 "$work/lock.stderr")"
  kill "$holder" 2>/dev/null || true
  wait "$holder" 2>/dev/null || true
  echo "$p: exited in $took ms; $(grep -c "writer lock" "$work/lock.stderr") message(s)"
done
echo "hangs $hangs"
[ "$hangs" = 0 ] || broken=1

echo "== truncation: cut between two executes, $rounds rounds per cut"
sigbus=0 wrong_next=0 served=0 said=0 runs=0
for p in "${programs[@]}"; do
  for mode in file mmap; do
    for cut in zero half 4k; do
      for ((r = 0; r < rounds; r++)); do
        rm -f "$work/t.xbc"
        launch "$p" "$work/t.xbc" "$work/tcold" "$mode"
        mkfifo "$work/go"
        rm -f "$work/twarm.stderr" "$work/twarm/output0.f32"
        (
          status=0
          "$runner" "$data/$p.pte" --data "$data/$p.ptd" --input "$data/$p.s0.in0.bin" \
            --load-mode "$mode" --cache "$work/t.xbc" --repeat 2 --wait-between-executes \
            --output-dir "$work/twarm" <"$work/go" >/dev/null 2>"$work/twarm.stderr" || status=$?
          echo "$status" >"$work/twarm.status"
        ) &
        exec 3>"$work/go"
        until grep -q "waiting for a line" "$work/twarm.stderr" 2>/dev/null; do sleep 0.02; done
        len=$(stat -c %s "$work/t.xbc")
        case $cut in
          zero) truncate -s 0 "$work/t.xbc" ;;
          half) truncate -s $((len / 2)) "$work/t.xbc" ;;
          4k) truncate -s $((len - 4096)) "$work/t.xbc" ;;
        esac
        echo >&3
        exec 3>&-
        wait
        rm -f "$work/go"
        status=$(cat "$work/twarm.status")
        runs=$((runs + 1))
        [ "$status" -ge 128 ] && sigbus=$((sigbus + 1))
        grep -q "cut short while mapped" "$work/twarm.stderr" && said=$((said + 1))
        # An execute that read a cut page must fail; one that succeeded gave right outputs.
        if [ "$status" = 0 ] && ! cmp -s "$work/tcold/output0.f32" "$work/twarm/output0.f32"; then
          served=$((served + 1))
        fi
        launch "$p" "$work/t.xbc" "$work/tnext" "$mode" || wrong_next=$((wrong_next + 1))
        cmp -s "$work/tcold/output0.f32" "$work/tnext/output0.f32" || wrong_next=$((wrong_next + 1))
      done
    done
  done
done
echo "$runs launches: killed by a signal $sigbus, execute failed with the cause $said," \
  "wrong outputs served $served, wrong next launches $wrong_next"
[ "$sigbus" = 0 ] && [ "$served" = 0 ] && [ "$wrong_next" = 0 ] || broken=1

echo "== disk full: a 1 MiB tmpfs, for about 2.8 MiB of packed weights"
if mkdir -p "$work/full" && mount -t tmpfs -o size=1m tmpfs "$work/full" 2>/dev/null; then
  big=arch_resnet_fp32
  said=0 wrong=0
  launch "$big" "$work/none.xbc" "$work/fref" file --no-weight-cache
  for ((r = 0; r < 3; r++)); do
    launch "$big" "$work/full/w.xbc" "$work/fout" file || wrong=$((wrong + 1))
    cmp -s "$work/fref/output0.f32" "$work/fout/output0.f32" || wrong=$((wrong + 1))
    grep -q "No space left on device" "$work/fout.stderr" && said=$((said + 1))
  done
  echo "$big: 3 launches, the failure said in $said, wrong or failed $wrong," \
    "temporaries left $(find "$work/full" -name '*.xnnblob-tmp-*' | wc -l)"
  [ "$wrong" = 0 ] || broken=1
  umount "$work/full"
else
  echo "skipped: cannot mount a tmpfs (not root)"
fi

echo "== foreign files at the cache path"
replaced=0
for p in "${programs[@]}"; do
  printf 'my notes\n' >"$work/notes.txt"
  cp "$data/$p.ptd" "$work/own.ptd"
  sum_notes=$(cksum <"$work/notes.txt")
  sum_ptd=$(cksum <"$work/own.ptd")
  launch "$p" "$work/notes.txt" "$work/fo" file || true
  "$runner" "$data/$p.pte" --data "$work/own.ptd" --input "$data/$p.s0.in0.bin" \
    --cache "$work/own.ptd" --output-dir "$work/fo" >/dev/null 2>&1 || true
  [ "$(cksum <"$work/notes.txt")" = "$sum_notes" ] || replaced=$((replaced + 1))
  [ "$(cksum <"$work/own.ptd")" = "$sum_ptd" ] || replaced=$((replaced + 1))
done
echo "files replaced $replaced"
[ "$replaced" = 0 ] || broken=1

exit $broken
