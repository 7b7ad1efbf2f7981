"""nys runs on tcmalloc where it is installed (``nyscli.allocator``): the environment it
re-executes with, the one ``nys bench``'s workers get back, and what env.json records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nyscli.allocator import (
    ALLOCATOR_ENV,
    LIBRARIES,
    NO_REPORT,
    PRELOADED_ENV,
    REPORT_ENV,
    active,
    find_tcmalloc,
    preload_environ,
    preloaded,
    system_environ,
)
from nyscli.errors import UserInputError
from tests.helpers import nys_subprocess, run_folders

LIB = "/opt/x/libtcmalloc_minimal.so.4"


def test_auto_preloads_the_library_found_ahead_of_the_users_own():
    env = preload_environ({"LD_PRELOAD": "/u/a.so:/u/b.so", "HOME": "/h"}, LIB)
    assert env is not None
    assert env["LD_PRELOAD"] == f"{LIB}:/u/a.so:/u/b.so"
    assert env[PRELOADED_ENV] == LIB and env["HOME"] == "/h"
    assert env[REPORT_ENV] == NO_REPORT
    # A threshold the user set is theirs.
    assert preload_environ({REPORT_ENV: "5"}, LIB)[REPORT_ENV] == "5"
    assert preload_environ({ALLOCATOR_ENV: " TCMalloc "}, LIB)["LD_PRELOAD"] == LIB


@pytest.mark.parametrize(
    "environ, library",
    [
        ({}, None),  # auto, none installed: the system's malloc
        ({ALLOCATOR_ENV: "system"}, LIB),
        ({PRELOADED_ENV: LIB, "LD_PRELOAD": LIB}, LIB),  # the re-executed process itself
        ({"_NYS_COMPLETE": "complete_bash"}, LIB),  # tab completion
        ({"LD_PRELOAD": "/u/libjemalloc.so.2"}, LIB),  # the user's own allocator
        ({"LD_PRELOAD": "/u/a.so:/u/libtcmalloc.so.4", ALLOCATOR_ENV: "tcmalloc"}, LIB),
    ],
)
def test_no_reexecution(environ, library):
    assert preload_environ(environ, library) is None


@pytest.mark.parametrize("value", ["bogus", "1", "jemalloc"])
def test_a_bad_choice_is_one_line_naming_it(value):
    with pytest.raises(UserInputError, match=f"NYS_ALLOCATOR='{value}' is not allowed; choose"):
        preload_environ({ALLOCATOR_ENV: value}, LIB)


def test_tcmalloc_asked_for_beside_another_preloaded_allocator_is_refused():
    environ = {"LD_PRELOAD": "/u/libmimalloc.so.2", ALLOCATOR_ENV: "tcmalloc"}
    with pytest.raises(UserInputError, match="LD_PRELOAD already names /u/libmimalloc.so.2"):
        preload_environ(environ, LIB)


def test_tcmalloc_asked_for_but_missing_says_how_to_install_it():
    with pytest.raises(UserInputError, match="libtcmalloc-minimal4"):
        preload_environ({ALLOCATOR_ENV: "tcmalloc"}, None)


def test_off_linux_nothing_is_preloaded_and_asking_for_tcmalloc_says_why(monkeypatch):
    monkeypatch.setattr("nyscli.allocator.sys.platform", "darwin")
    assert preload_environ({}, LIB) is None
    with pytest.raises(UserInputError, match="NYS_ALLOCATOR=tcmalloc works on Linux only"):
        preload_environ({ALLOCATOR_ENV: "tcmalloc"}, LIB)


def test_bench_workers_get_the_system_malloc_and_keep_the_users_preload():
    env = preload_environ({"LD_PRELOAD": "/u/a.so", "PATH": "/bin"}, LIB)
    back = system_environ(env)
    assert back["LD_PRELOAD"] == "/u/a.so" and back["PATH"] == "/bin"
    assert PRELOADED_ENV not in back and back[ALLOCATOR_ENV] == "system"
    assert preloaded(back) == "system"
    alone = system_environ(preload_environ({}, LIB))
    assert "LD_PRELOAD" not in alone and preloaded(alone) == "system"
    # A user's own allocator stays, and is what a worker then runs on.
    theirs = {"LD_PRELOAD": "/u/a.so:/u/libjemalloc.so.2"}
    assert preloaded(system_environ(theirs)) == "/u/libjemalloc.so.2"
    # A worker started from it does not preload again.
    assert preload_environ(alone, LIB) is None


def test_find_prefers_the_minimal_build(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert find_tcmalloc([first, second]) is None
    (second / LIBRARIES[1]).write_bytes(b"")
    assert find_tcmalloc([first, second]) == str(second / LIBRARIES[1])
    (second / LIBRARIES[0]).write_bytes(b"")
    assert find_tcmalloc([first, second]) == str(second / LIBRARIES[0])


def test_active_names_the_mapped_allocator():
    line = "7f00-7f10 r-xp 00000000 08:01 123   {}\n"
    libc = line.format("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert active(libc + "7f20-7f30 rw-p 00000000 00:00 0\n") == "system"
    jemalloc = "/opt/j/lib/libjemalloc.so.2"
    assert active(libc + line.format(jemalloc)) == jemalloc
    assert active(line.format(LIB) + libc) == LIB


def _allocator(folder: Path) -> str:
    (run,) = run_folders(folder / "outputs")
    return json.loads((run / "env.json").read_text())["allocator"]


def test_env_json_records_the_allocator_the_run_ran_on(tmp_path, monkeypatch):
    """End to end: ``nys`` re-executes itself on tcmalloc where this machine has it (else
    it stays on the system's malloc), and ``NYS_ALLOCATOR=system`` never preloads."""
    found = find_tcmalloc()
    for choice, expected in (("auto", found), ("system", None)):
        folder = tmp_path / choice
        folder.mkdir()
        monkeypatch.setenv(ALLOCATOR_ENV, choice)
        done = nys_subprocess(folder, "approx-error", "seq_len=32")
        assert done.returncode == 0, done.stdout + done.stderr
        recorded = _allocator(folder)
        if expected is None:
            assert recorded == "system"
        else:
            assert os.path.realpath(recorded) == os.path.realpath(expected)


def test_a_bad_choice_on_the_command_line_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ALLOCATOR_ENV, "fast")
    done = nys_subprocess(tmp_path, "approx-error", "seq_len=32")
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert lines == [
        "error: NYS_ALLOCATOR='fast' is not allowed; choose one of: auto, tcmalloc, system"
    ], lines
    assert not (tmp_path / "outputs").exists()
