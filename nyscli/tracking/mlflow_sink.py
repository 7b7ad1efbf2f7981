"""MLflow: one MLflow run per ``nys`` run, in a local SQLite store by default.

Params are the flattened resolved config; metrics are the ``metrics.csv`` rows (``<split>/<
metric>`` at the optimizer step) and, at the end, the results row; the run folder's CSV and
PNG files (and ``.hydra/config.yaml``) are its artifacts. The run's id is kept in
``<run>/tracking.json``, so a resumed run (a new run folder) continues the same MLflow run.

No step twice: MLflow keeps every point it is sent, so training rows are sent when the
checkpoint that covers them is written. An interrupted run has then sent exactly the steps its
``last.pt`` holds, which is where its resume starts; rows it logged after that are redone.
A sweep's jobs are child runs of one parent run named after the sweep folder.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from nyscli.files import exclusive_lock, write_json
from nyscli.tracking.config import MLFLOW_ARTIFACTS, default_mlflow_uri, missing_extra
from nyscli.tracking.sinks import Row, Sink

TRACKING_FILE = "tracking.json"  # in the run folder: which MLflow run holds it
PARENT_FILE = "mlflow_parent.json"  # in a sweep folder: the sweep's parent run
PARAM_BATCH = 100  # MLflow takes at most 100 params and 1000 metrics per batch call
METRIC_BATCH = 1000
PARAM_LENGTH = 6000  # MLflow's longest param value
ARTIFACT_SUFFIXES = (".csv", ".png")


def _check_sqlite(path: Path) -> None:
    """Open a SQLite store once, for writing, before MLflow does: MLflow retries an engine it
    cannot create for about 2 minutes, with a warning block each time (a read-only disk, a
    folder that does not exist), before the error that ``nys`` reports as its one warning."""
    path.parent.mkdir(parents=True, exist_ok=True)  # as MLflow does (outputs/ may be new)
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
            db.execute("BEGIN IMMEDIATE")
            db.rollback()
    except sqlite3.Error as error:
        raise OSError(f"cannot open the MLflow store {path} for writing: {error}") from None


def _client(uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise missing_extra("logger=mlflow") from None
    if uri.startswith("sqlite:///"):
        _check_sqlite(Path(uri.removeprefix("sqlite:///")))
    return MlflowClient(tracking_uri=uri)


def store_uri(settings: dict[str, Any]) -> str:
    return str(settings.get("tracking_uri") or default_mlflow_uri())


def _experiment(client: Any, uri: str, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = None
    if uri.startswith("sqlite:///"):  # artifacts beside the database, not in the cwd
        location = (Path(uri.removeprefix("sqlite:///")).parent / MLFLOW_ARTIFACTS).as_uri()
    with contextlib.suppress(Exception):  # another job of the sweep created it meanwhile
        return str(client.create_experiment(name, artifact_location=location))
    return str(client.get_experiment_by_name(name).experiment_id)


def recorded_run(run_dir: Path | None, uri: str) -> str | None:
    """The MLflow run id a run folder's ``tracking.json`` names for store ``uri``."""
    if run_dir is None or not (run_dir / TRACKING_FILE).is_file():
        return None
    record = json.loads((run_dir / TRACKING_FILE).read_text()).get("mlflow") or {}
    return record.get("run_id") if record.get("tracking_uri") == uri else None


def _parent(client: Any, experiment: str, sweep_dir: Path) -> str:
    """The sweep's parent run (created by its first job, under a lock: jobs may be parallel)."""
    with exclusive_lock(sweep_dir / ".mlflow_parent.lock"):
        path = sweep_dir / PARENT_FILE
        if path.is_file():
            return str(json.loads(path.read_text())["run_id"])
        run = client.create_run(
            experiment, run_name=sweep_dir.name, tags={"nys.sweep_dir": str(sweep_dir)}
        )
        write_json({"run_id": run.info.run_id}, path)
        return str(run.info.run_id)


def open_run(
    settings: dict[str, Any],
    run_dir: Path,
    command: str,
    params: dict[str, Any],
    previous_dir: Path | None = None,
    sweep_dir: Path | None = None,
) -> tuple[Any, str, bool]:
    """(client, run id, continued): the run ``run_dir`` already records, the resumed run's
    (``previous_dir``), or a new one with ``params`` logged. Recorded in ``tracking.json``."""
    uri = store_uri(settings)
    client = _client(uri)
    run_id = recorded_run(run_dir, uri)
    continued = run_id is not None or recorded_run(previous_dir, uri) is not None
    run_id = run_id or recorded_run(previous_dir, uri)
    if run_id is not None:
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, "nys.run_dir", str(run_dir.resolve()))
    else:
        experiment = _experiment(client, uri, str(settings.get("experiment") or command))
        tags = {"nys.run_dir": str(run_dir.resolve()), "nys.command": command}
        if sweep_dir is not None:
            tags["mlflow.parentRunId"] = _parent(client, experiment, sweep_dir)
        run_id = str(client.create_run(experiment, run_name=run_dir.name, tags=tags).info.run_id)
        _log_params(client, run_id, params)
    if not (run_dir / TRACKING_FILE).is_file():
        write_json({"mlflow": {"tracking_uri": uri, "run_id": run_id}}, run_dir / TRACKING_FILE)
    return client, run_id, continued


def _log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:PARAM_LENGTH]) for k, v in params.items()]
    for start in range(0, len(items), PARAM_BATCH):
        client.log_batch(run_id, params=items[start : start + PARAM_BATCH])


def log_rows(client: Any, run_id: str, rows: list[Row]) -> None:
    """Each row's values as ``<split>/<metric>`` at its step, in as few calls as MLflow takes."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    points = [
        Metric(f"{row.split}/{key}", value, now, row.step)
        for row in rows
        for key, value in row.values.items()
    ]
    for start in range(0, len(points), METRIC_BATCH):
        client.log_batch(run_id, metrics=points[start : start + METRIC_BATCH])


def last_logged_step(client: Any, run_id: str) -> int:
    """The newest step this run has a ``<split>/loss`` point for (every metrics.csv row has a
    loss, whatever its split is called; -1: none)."""
    steps = [-1]
    for key in client.get_run(run_id).data.metrics:
        if key.endswith("/loss"):
            steps += [int(m.step) for m in client.get_metric_history(run_id, key)]
    return max(steps)


class MlflowSink(Sink):
    name = "mlflow"

    def __init__(self, client: Any, run_id: str, continued: bool) -> None:
        self.client, self.run_id, self.continued = client, run_id, continued
        self.pending: list[Row] = []

    def resume(self, rows: list[Row]) -> None:
        # A continued run already holds the steps up to the checkpoint it resumes from; a run
        # first logged to MLflow now gets the carried rows, like a fresh event file.
        last = last_logged_step(self.client, self.run_id) if self.continued else -1
        log_rows(self.client, self.run_id, [r for r in rows if r.step > last])

    def row(self, row: Row) -> None:
        if row.split == "test":  # after training: no resume can redo it
            log_rows(self.client, self.run_id, [row])
        else:
            self.pending.append(row)

    def checkpoint(self, step: int) -> None:
        ready = [r for r in self.pending if r.step <= step]
        self.pending = [r for r in self.pending if r.step > step]
        log_rows(self.client, self.run_id, ready)

    def close(self) -> None:
        self.checkpoint(max((r.step for r in self.pending), default=0))


def finish_run(
    client: Any, run_id: str, run_dir: Path, metrics: dict[str, float], step: int
) -> None:
    """The final metrics at ``step``, the run folder's CSV/PNG files and config as artifacts,
    and the run marked finished."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    points = [Metric(k, v, now, step) for k, v in metrics.items()]
    if points:
        client.log_batch(run_id, metrics=points)
    for path in sorted(run_dir.iterdir()):
        if path.is_file() and path.suffix in ARTIFACT_SUFFIXES:
            client.log_artifact(run_id, str(path))
    config = run_dir / ".hydra" / "config.yaml"
    if config.is_file():
        client.log_artifact(run_id, str(config), artifact_path="hydra")
    client.set_terminated(run_id, status="FINISHED")
    parent = client.get_run(run_id).data.tags.get("mlflow.parentRunId")
    if parent:  # a sweep's parent run ends with its jobs (each finished job says so)
        client.set_terminated(parent, status="FINISHED")
