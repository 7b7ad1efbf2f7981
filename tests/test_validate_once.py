"""A job is validated once in the process that runs it: before its run folder exists (the
launcher's check) and not again when the local launcher runs it in the same process."""

from __future__ import annotations

import pytest

from nyscli.experiments.bench import command as bench


@pytest.mark.parametrize("multirun", [False, True])
def test_a_local_job_is_validated_once(nys_here, monkeypatch, tmp_path, multirun):
    seen = []
    checked = bench.validate
    monkeypatch.setattr(bench, "validate", lambda cfg: seen.append(1) or checked(cfg))
    args = ["bench", "--seq-len", "16", "attention_set=none", "attention_rows=[{name:softmax}]"]
    args += ["repeats=1", "min_repeats=1", "warmup=0", "threads=1"]
    if multirun:
        args += ["-m", "seed=0,1"]
    done = nys_here(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(seen) == (2 if multirun else 1)  # one per job
