"""threads=null: torch's default less the cores other work keeps busy when a job starts."""

from __future__ import annotations

import pytest
import torch

from nyscli.train import resources

# /proc/stat's per-core lines: user nice system idle iowait irq softirq steal (ticks)
BEFORE = "cpu  0 0 0 0 0 0 0 0\ncpu0 100 0 0 900 0 0 0 0\ncpu1 50 0 0 950 0 0 0 0\n"
# 10 ticks later: core 0 spent 9 of them on a user process, core 1 idled but for one of iowait
AFTER = "cpu  0 0 0 0 0 0 0 0\ncpu0 109 0 0 901 0 0 0 0\ncpu1 50 0 0 959 1 0 0 0\n"


@pytest.fixture
def two_cores(monkeypatch):
    """torch's default of 2 threads on a 2-core machine; the count comes back after."""
    before = torch.get_num_threads()
    monkeypatch.setattr(resources, "_torch_default_threads", lambda: 2)
    monkeypatch.setattr(resources, "usable_cores", lambda: {0, 1})
    yield
    torch.set_num_threads(before)


def test_busy_share_of_each_core_from_two_snapshots_of_proc_stat(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(BEFORE)
    monkeypatch.setattr(resources, "_PROC_STAT", stat)
    monkeypatch.setattr(resources.time, "sleep", lambda s: stat.write_text(AFTER))
    assert resources.busy_cores({0, 1}) == pytest.approx(0.9)  # iowait counts as idle
    stat.write_text(BEFORE)
    assert resources.busy_cores({1}) == pytest.approx(0.0)  # only the cores asked about


@pytest.mark.parametrize(("busy", "threads"), [(0.0, 2), (0.4, 2), (0.9, 1), (1.6, 1), (2.0, 1)])
def test_null_threads_leave_the_busy_cores_to_the_work_on_them(
    two_cores, monkeypatch, busy, threads
):
    monkeypatch.setattr(resources, "busy_cores", lambda cores: busy)
    assert resources.resolve_threads(None) == threads == torch.get_num_threads()


def test_a_set_count_is_kept_and_null_goes_back_to_the_default_each_job(two_cores, monkeypatch):
    loads = iter([1.0, 0.0])
    monkeypatch.setattr(resources, "busy_cores", lambda cores: next(loads))
    assert resources.resolve_threads(2) == 2  # as set, whatever the load: nothing sampled
    assert resources.resolve_threads(None) == 1  # a job while another process ran
    assert resources.resolve_threads(None) == 2  # the next job of the sweep, on a quiet machine


def test_no_sample_where_the_default_is_one_thread(monkeypatch):
    monkeypatch.setattr(resources, "_torch_default_threads", lambda: 1)
    monkeypatch.setattr(resources, "busy_cores", lambda cores: pytest.fail("sampled"))
    before = torch.get_num_threads()
    try:
        assert resources.resolve_threads(None) == 1
    finally:
        torch.set_num_threads(before)


def test_the_note_on_fewer_threads_goes_to_the_log_file_not_the_console(
    two_cores, monkeypatch, caplog
):
    # On the console it would stand between a later refusal and its one line.
    import logging

    from nyscli.console import ConsoleLogHandler, console

    monkeypatch.setattr(resources, "busy_cores", lambda cores: 1.0)
    with caplog.at_level(logging.INFO, logger="nys"), console.capture() as shown:
        handler = ConsoleLogHandler()
        logging.getLogger("nys").addHandler(handler)
        try:
            resources.resolve_threads(None)
            logging.getLogger("nys").info("a line for both")
        finally:
            logging.getLogger("nys").removeHandler(handler)
    notes = [r.getMessage() for r in caplog.records]
    assert "threads: 1 of 2 (other work keeps 1 core(s) busy; threads=2 uses all)" in notes
    assert "a line for both" in shown.get() and "threads: 1 of 2" not in shown.get()
