"""scripts/gpu_run at toy size on the CPU: the GPU run's path (bench, peers, chunked LRA, results
file)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_run"


def gpu_run(out: Path) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(SCRIPT), str(out), "--toy", "--skip", "text"]
    args += ["--attentions", "nystrom"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_the_gpu_script_at_toy_size_benches_trains_in_resumed_chunks_and_reports(tmp_path):
    out = tmp_path / "gpu"
    done = gpu_run(out)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (out / "gpu_results.md").read_text()

    # The bench table shows each row's time and its speed-up over SDPA from results.csv.
    with open(out / "bench" / "core-bf16" / "results.csv", newline="") as handle:
        rows = {r["method"]: r for r in csv.DictReader(handle)}
    sdpa, nystrom = float(rows["softmax"]["time_ms"]), float(rows["nystrom"]["time_ms"])
    cell = re.search(r"\| nystrom-16 \| ([\d.]+) ms, \d+ MB \(([\d.]+)×", report)
    assert cell is not None, report
    assert float(cell[1]) == round(nystrom, 2)
    assert float(cell[2]) == round(sdpa / nystrom, 2)

    # The peers stage ran to the end (scripts/gpu_peers.py, tests/test_gpu_peers.py) and its
    # tables are in the report.
    assert (out / "peers" / "complete").is_file()
    assert "### Nyström peers (scripts/gpu_peers.py)" in report
    assert "#### peers bf16 fwd+bwd" in report and "| hf | " in report

    # The LRA cell ran in two chunks, the second resuming the first, to the planned 6 steps.
    cell_dir = out / "lra" / "listops-nystrom"
    assert (cell_dir / "chunk-1" / "resumed_from.txt").read_text().strip() == str(
        cell_dir / "chunk-0"
    )
    with open(cell_dir / "chunk-1" / "results.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["status"], row["steps"]) == ("ok", "6")
    assert "| listops-nystrom | 2 | ok | 6 / 6 |" in report

    # Run again: everything is done, nothing is run again.
    log = (out / "gpu_run.log").read_text()
    again = gpu_run(out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (out / "gpu_run.log").read_text() == log


def test_a_cell_stopped_by_its_time_budget_is_reported_without_a_test_score(tmp_path):
    # A chunk that stopped early leaves test_accuracy empty: the report says so, it does not crash.
    chunk = tmp_path / "gpu" / "lra" / "text-nystrom" / "chunk-0"
    chunk.mkdir(parents=True)
    row = {"status": "stopped at step 10523", "steps": "10523", "max_steps": "20000"}
    row |= {"test_accuracy": "", "majority_rate": "0.5", "rule_accuracy": "0.5"}
    row |= {"best_dev_accuracy": "0.6435", "tokens_per_s": "1003855.4", "peak_mb": "1334.4"}
    row |= {"train_s": "435.9"}
    with open(chunk / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    args = [sys.executable, str(SCRIPT), str(tmp_path / "gpu"), "--toy"]
    skip = ["--skip", "bench,peers,listops,text"]
    done = subprocess.run(args + skip, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "gpu" / "gpu_results.md").read_text()
    cells = "| text-nystrom | 1 | stopped at step 10523 | 10523 / 20000 | — | 50.00 | 50.00 | 64.35"
    assert cells in report
