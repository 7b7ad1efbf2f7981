#!/bin/bash
# How soon a one-line refusal comes, quiet and beside 1 and 2 busy processes (each a
# `python3 -c 'while True: pass'`; with 2 the script waits 75 s for the load average to
# reach ~2 before it times). Each case runs REPS times from this tree and, with BEFORE, from
# that source tree too (e.g. a `git worktree add /tmp/before <commit>`), alternating, on the
# same Python. Writes CSV rows: busy,load1,version,args,rc,seconds,first_line.
# Usage: scripts/refusal_times.sh OUT.csv [BEFORE]   (from the repository root; ~5 minutes)
set -u
OUT=$1 BEFORE=${2:-} REPS=${REPS:-2}
PY=${PY:-$PWD/.venv/bin/python3}
HERE=$PWD
echo "busy,load1,version,args,rc,seconds,first_line" > "$OUT"
cd "$(mktemp -d)"
CASES=(
  "bench --seq-len -5" "lra trainer.lr=abc" "pretrain tokenizer.vocab_size=5"
  "finetune task.max_len=2" "approx-error budget_unit=pair" "lra scheduler=cpu"
  "lra attention=nystrom attention.num_landmarks=0"
)
for busy in 0 1 2; do
  pids=""
  for _ in $(seq 1 $busy); do python3 -c 'while True: pass' & pids="$pids $!"; done
  if [ "$busy" = 2 ]; then sleep 75; else sleep 5; fi
  for args in "${CASES[@]}"; do
    for _ in $(seq 1 "$REPS"); do
      for version in ${BEFORE:+before} after; do
        if [ "$version" = before ]; then src=$BEFORE; else src=$HERE; fi
        start=$(date +%s.%N)
        # shellcheck disable=SC2086  # the case's words are the command line
        line=$(PYTHONPATH=$src "$PY" -c 'import sys; from nyscli.cli import main; sys.argv[0] = "nys"; sys.exit(main())' $args 2>&1)
        rc=$?
        end=$(date +%s.%N)
        first=$(echo "$line" | head -1 | cut -c1-90 | tr -d '"')
        echo "$busy,$(cut -d' ' -f1 /proc/loadavg),$version,$args,$rc,$(echo "$end - $start" | bc),\"$first\"" >> "$OUT"
      done
    done
  done
  [ -n "$pids" ] && kill $pids
done
