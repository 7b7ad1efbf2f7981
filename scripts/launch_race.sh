#!/bin/bash
# Launch races with the real entry point: ROUNDS rounds (default 20), each starting 8
# `nys approx-error` processes at once with one hydra.run.dir; prints, per round, how many ran
# and how many were refused, and what the folder holds (one run's files, one results line).
# Usage: scripts/launch_race.sh [ROUNDS]   (run from the repository root; ~4 s a round, quiet)
set -u
NYS=${NYS:-$PWD/.venv/bin/nys}
cd "$(mktemp -d)"
for r in $(seq 1 "${1:-20}"); do
  for i in 1 2 3 4 5 6 7 8; do
    ( "$NYS" approx-error seq_len=16 budgets=4 heads=1 threads=1 plots=false "methods=[nystrom]" \
        hydra.run.dir="run$r" > "out$r.$i" 2>&1; echo $? > "rc$r.$i" ) &
  done
  wait
  ran=$(grep -lx 0 rc"$r".* | wc -l)
  refused=$(grep -lx 2 rc"$r".* | wc -l)
  results=$(grep -c "results:" "run$r/approx_error.log")
  echo "round $r: ran=$ran refused=$refused results_lines=$results files=$(ls -A "run$r" | tr '\n' ' ')"
done
