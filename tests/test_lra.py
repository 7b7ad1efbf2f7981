"""``nys lra`` end to end on a tiny generated ListOps, resume through the CLI, errors, render."""

from __future__ import annotations

import os
import stat

import pandas as pd
from rich.console import Console

from nyscli.experiments.lra.command import render
from tests.helpers import LRA_TINY as TINY
from tests.helpers import run_folders


def test_lra_runs_stops_resumes_and_rejects_a_corrupt_checkpoint(run_nys, tmp_path):
    cache = f"data_cache={tmp_path / 'cache'}"
    first = run_nys("lra", *TINY, cache, "trainer.stop_at_step=2")
    assert first.returncode == 0, first.stdout + first.stderr
    [run] = run_folders(tmp_path / "outputs" / "lra")
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert row.status == "stopped at step 2" and row.steps == 2
    for name in ("metrics.csv", "learning_curve.png", "checkpoints/last.pt", "lra.log"):
        assert (run / name).exists(), name

    resumed = run_nys("lra", *TINY, cache, "--resume", "true")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    second = next(r for r in run_folders(tmp_path / "outputs" / "lra") if r != run)
    result = pd.read_csv(second / "results.csv").iloc[0]
    assert result.status == "ok" and result.steps == 4
    assert result.task == "listops" and result.attention.startswith("nystrom")
    assert 0 <= result.test_accuracy <= 1 and result.tokens_per_s > 0 and result.peak_mb > 0
    metrics = pd.read_csv(second / "metrics.csv")
    assert list(metrics[metrics.split == "train"].step) == [1, 2, 3, 4]  # carried over + new
    assert (metrics.split == "test").sum() == 1
    assert "test %" in resumed.stdout

    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")  # the unfinished run
    broken = run_nys("lra", *TINY, cache, f"resume={run}")
    assert broken.returncode == 2
    assert "corrupt or unreadable" in broken.stdout
    assert "Traceback" not in broken.stdout + broken.stderr


def test_run_files_follow_the_umask(run_nys, tmp_path):
    """Every file a run leaves (results, metrics, env.json, checkpoints, figures, logs) gets
    0666 less the umask, as files the user creates do; the atomic writer's temp files used to
    leave results.csv, metrics.csv, env.json and checkpoints at 0600."""
    previous = os.umask(0o027)  # the child inherits it; 027 tells it from 022 and from 077
    try:
        done = run_nys("lra", *TINY, f"data_cache={tmp_path / 'cache'}")
    finally:
        os.umask(previous)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_folders(tmp_path / "outputs" / "lra")
    files = {p.relative_to(run).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in run.rglob("*") if p.is_file()}  # fmt: skip
    for name in ("results.csv", "metrics.csv", "env.json", "checkpoints/best.pt", "lra.log"):
        assert name in files, sorted(files)
    assert {name: oct(mode) for name, mode in files.items() if mode != 0o640} == {}


def test_bad_values_fail_in_one_line(nys_here):
    done = nys_here("lra", "trainer.precision=fp64")
    assert done.returncode == 2
    assert "trainer.precision=fp64 is not allowed" in done.stdout


def test_render_lays_a_sweep_out_as_table_3():
    rows = []
    for attention, base in (("softmax", 0.37), ("nystrom-64", 0.38)):
        for i, task in enumerate(("text", "listops")):
            rows.append(
                dict(task=task, attention=attention, test_accuracy=base + i / 10,
                     best_dev_accuracy=base, steps=10, max_steps=10, wall_s=60.0,
                     tokens_per_s=1000.0 * (i + 1), peak_mb=100.0)
            )  # fmt: skip
    console = Console(width=200, record=True)
    console.print(render(pd.DataFrame(rows)))
    text = console.export_text()
    assert "Table 3" in text and "Training tokens/s" in text
    header = next(line for line in text.splitlines() if "listops" in line and "avg" in line)
    assert header.index("listops") < header.index("text")  # LRA's column order
    nystrom = next(line for line in text.splitlines() if line.startswith("│ nystrom-64"))
    assert "38.00" in nystrom and "48.00" in nystrom and "43.00" in nystrom  # avg


def lra_attention_and_pooling(*overrides: str) -> tuple[dict, str]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from nyscli.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("lra", overrides=list(overrides))
    return OmegaConf.to_container(cfg.attention, resolve=True), cfg.model.pooling


def test_nystrom_gets_the_papers_lra_conv_skip_and_listops_pools_cls():
    attention, pooling = lra_attention_and_pooling("task=listops")
    assert attention["name"] == "nystrom" and attention["conv_kernel_size"] == 35
    assert pooling == "cls"
    attention, pooling = lra_attention_and_pooling("task=text", "attention=softmax")
    assert attention["conv_kernel_size"] == 0 and pooling == "mean"
    attention, _ = lra_attention_and_pooling("model.nystrom_conv_kernel_size=0")
    assert attention["conv_kernel_size"] == 0
    attention, _ = lra_attention_and_pooling("attention.conv_kernel_size=9")
    assert attention["conv_kernel_size"] == 9
