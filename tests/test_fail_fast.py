"""``--fail-fast``: a sweep stops at its first failed job, one line, exit 1; without it the
other jobs still run and one line lists the failed ones."""

from __future__ import annotations

import shutil

import pytest

from nyscli.launch.run import launch
from nyscli.output.runs import ERROR_FILE, RESULTS_FILE
from tests.helpers import write_fashion_mnist

TINY_IMAGE = [
    "task=image",
    "data.source=fashion_mnist",
    "data.val_fraction=0.25",
    "task.test_examples=8",
    "model.dim=16",
    "model.ffn_dim=16",
    "model.depth=1",
    "attention=softmax",
    "trainer.batch_size=4",
    "trainer.max_steps=2",
    "trainer.planned_steps=2",
    "trainer.warmup_steps=0",
    "trainer.eval_every=1000",
    "trainer.eval_examples=8",
    "trainer.progress=false",
    "threads=1",
]


@pytest.fixture
def three_data_folders(tmp_path):
    """Fashion-MNIST folders for jobs 0, 1, 2: the second one's train images cut short."""
    good = write_fashion_mnist(tmp_path / "good", 24, 8)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    images = corrupt / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])  # the header promises 24 images
    other = write_fashion_mnist(tmp_path / "other", 24, 8, seed=1)
    return [good, corrupt, other]


def sweep(tmp_path, folders, *extra):
    paths = ",".join(str(f) for f in folders)
    where = tmp_path / "sweep"
    args = ["-m", *TINY_IMAGE, f"data.path={paths}", f"data_cache={tmp_path / 'cache'}"]
    return launch("lra", [*args, f"hydra.sweep.dir={where}", *extra]), where


def last_line(capsys) -> str:
    out = capsys.readouterr()
    return (out.out + out.err).strip().splitlines()[-1]


def test_fail_fast_stops_the_sweep_at_the_first_failed_job(
    three_data_folders, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code, where = sweep(tmp_path, three_data_folders, "fail_fast=true")
    line = last_line(capsys)
    assert code == 1
    assert line.startswith("error: job 1 failed: ") and "train-images-idx3-ubyte" in line
    assert line.endswith("fail_fast stopped the sweep there (job 1 of 3: no later job was started)")
    assert (where / "0" / RESULTS_FILE).is_file()
    assert (where / "1" / ERROR_FILE).is_file() and not (where / "1" / RESULTS_FILE).exists()
    assert not (where / "2").exists()  # never started


def test_without_fail_fast_the_other_jobs_still_run(
    three_data_folders, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code, where = sweep(tmp_path, three_data_folders)
    assert code == 1
    assert last_line(capsys) == f"1 job(s) failed; see {where / '1'}"
    assert (where / "0" / RESULTS_FILE).is_file() and (where / "2" / RESULTS_FILE).is_file()


def test_the_typed_flag_sets_the_key_and_a_bad_value_is_one_line(nys_here, tmp_path):
    # --fail-fast is fail_fast=true; a value that is no bool is refused before anything runs.
    done = nys_here("bench", "--fail-fast", "fail_fast=false", "-n", "64")
    assert done.returncode == 2 and "fail_fast is given twice" in done.stdout + done.stderr
    done = nys_here("bench", "fail_fast=maybe", "-n", "64")
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and "fail_fast" in said and "maybe" in said
    assert len(said.splitlines()) == 1 and not (tmp_path / "outputs").exists()
