"""The paper's reference numbers (Xiong et al., AAAI 2021), shown dimmed beside our results.

Table 1: one input instance through one self-attention module on a 1080Ti; Table 2: BERT-base
vs Nyströmformer on GLUE and IMDB. (Table 3's rows live with its layout, ``lra_table``.)
"""

from __future__ import annotations

# The GPU Table 1 was measured on: its rows say so beside numbers measured on other devices.
TABLE1_DEVICE = "1080Ti"
# Table 1: peak memory (MB) and time (ms) by sequence length n. Linformer and Longformer were
# reported at n = 8192 only.
TABLE1: dict[str, dict[str, dict[int, float]]] = {
    "peak_mb": {
        "Transformer": {512: 54, 1024: 186, 2048: 685, 4096: 2620, 8192: 10233},
        "Nyströmformer-64": {512: 35, 1024: 63, 2048: 118, 4096: 229, 8192: 450},
        "Nyströmformer-32": {512: 26, 1024: 49, 2048: 96, 4096: 193, 8192: 383},
        "Linformer-256": {8192: 635},
        "Longformer-257": {8192: 455},
    },
    "time_ms": {
        "Transformer": {512: 0.8, 1024: 2.4, 2048: 10.0, 4096: 32.9, 8192: 155.4},
        "Nyströmformer-64": {512: 0.7, 1024: 1.3, 2048: 2.7, 4096: 5.9, 8192: 12.3},
        "Nyströmformer-32": {512: 0.6, 1024: 1.2, 2048: 2.6, 4096: 5.6, 8192: 11.5},
        "Linformer-256": {8192: 11.3},
        "Longformer-257": {8192: 36.2},
    },
}

# Table 2 (%): F1 for MRPC and QQP, accuracy otherwise; MNLI matched/mismatched.
TABLE2: dict[str, dict[str, str]] = {
    "BERT-base (paper)": {"sst2": "90.0", "mrpc": "88.4", "qnli": "90.3", "qqp": "87.3",
                          "mnli": "82.4/82.4", "imdb": "93.3"},
    "Nyströmformer (paper)": {"sst2": "91.4", "mrpc": "88.1", "qnli": "88.7", "qqp": "86.3",
                              "mnli": "80.9/82.2", "imdb": "93.2", "imdb@1024": "93.0"},
}  # fmt: skip


def table1_rows(column: str, seq_lens: list[int]) -> list[tuple[str, list[str]]]:
    """(row name, cells at ``seq_lens``) of Table 1's ``column`` (peak_mb | time_ms), each name
    saying the GPU it was measured on; rows with no number at any of ``seq_lens`` are left out."""
    rows = [
        (
            f"{name} (paper, {TABLE1_DEVICE})",
            [f"{values[n]:g}" if n in values else "" for n in seq_lens],
        )
        for name, values in TABLE1[column].items()
    ]
    return [(name, cells) for name, cells in rows if any(cells)]
