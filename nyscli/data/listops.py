"""LRA ListOps: a faithful, fast generator, a reference evaluator, the TSV reader and datasets.

What the official generator (``lra_benchmarks/data/listops.py`` in google-research/
long-range-arena) does, and what this module reproduces:

* A tree node at depth ``d < max_depth`` is an operator with probability 0.25, else a digit
  0-9; at ``d == max_depth`` it is always a digit. An operator has ``randint(2, max_args)``
  children (both ends included) and is one of ``[MIN [MAX [MED [SM`` (uniform).
  ``MED`` is ``int(np.median(args))`` (the mean of the two middle values, floored, for an even
  count); ``SM`` is ``sum(args) % 10``. The root is at depth 1.
* The *length* of a tree counts operators, digits and closing ``]`` (one per operator); it
  does **not** count parentheses. A tree is kept iff ``min_len < length < max_len``
  (strict, as in the release), defaults 500 and 2000.
* The release serialises the tree as nested binary pairs: ``( a b )`` for each pair, where an
  operator with arguments ``x1..xk`` is the left-nested chain
  ``((((op, x1), x2), ...), xk), ])``. So ``[MAX 2 9 ]`` is written
  ``( ( ( [MAX 2 ) 9 ) ] )``: every token is separated by one space, and an operator with k
  arguments carries ``k + 1`` opening and ``k + 1`` closing parentheses.
* Files are ``basic_{train,val,test}.tsv`` written by ``csv.writer(delimiter='\\t')``: header
  ``Source<TAB>Target``, rows ``<expression><TAB><label>``, CRLF line ends (csv's default).
  Default sizes 96k/2k/2k.

Choices made here (documented differences):

* Roots that would be a single digit (75 % of draws, always rejected) are not drawn, and a
  tree is abandoned as soon as its partial length reaches ``max_len``. Both only skip work
  on trees that the release rejects anyway, so the distribution of kept trees is the same.
* Trees are generated level by level for 1024 roots at a time with numpy: 96k training
  examples (635 MB of TSV) take ~20 s of CPU to generate and ~8 s to read back (measured on
  a shared 2-core machine; peak memory ~0.75 GB). Each split uses its own streams
  ``default_rng([seed, split_index, batch_index])``, so a split is reproducible on its own and
  a split of n examples is a prefix of the same split with more examples. The release
  de-duplicates trees; for trees of more than 500 tokens a repeat has probability ~0, so no
  de-duplication is done here.
* Tokenisation for models: the official pipeline's tfds tokenizer drops every
  non-alphanumeric token, losing ``]`` (and with it the tree structure). Here the default
  keeps ``]`` and drops the redundant parentheses, so the model sees exactly the release's
  *length* tokens (500..2000; nothing is cut at ``max_len=2000``); ``keep_parens=True`` keeps
  everything. Vocabulary (fixed, 18 ids): ``<pad>``=0, digits ``0..9`` = 1..10,
  ``[MIN [MAX [MED [SM`` = 11..14, ``]`` = 15, ``(`` = 16, ``)`` = 17.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from nyscli.data.common import (
    SPLITS,
    ClassificationCollate,
    DataError,
    GeneratorConfig,
    RaggedSequences,
    SequenceClassificationDataset,
    TaskData,
    ensure_generated,
    read_generated_splits,
    reading,
    require_file,
    require_path,
)
from nyscli.files import atomic_writer

MIN, MAX, MED, SM, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SM)
VOCAB: tuple[str, ...] = ("<pad>", *map(str, range(10)), *OPERATORS, END, "(", ")")
TOKEN_TO_ID = {tok: i for i, tok in enumerate(VOCAB)}
PAD_ID = 0
DIGIT0_ID = TOKEN_TO_ID["0"]  # digit d has id DIGIT0_ID + d
OP0_ID = TOKEN_TO_ID[MIN]  # operator j (index into OPERATORS) has id OP0_ID + j
END_ID = TOKEN_TO_ID[END]
LPAREN_ID = TOKEN_TO_ID["("]
RPAREN_ID = TOKEN_TO_ID[")"]
VOCAB_SIZE = len(VOCAB)
NUM_CLASSES = 10
HEADER = b"Source\tTarget\r\n"
OP_PROB = 0.25  # the release's VALUE_P: a node is an operator iff random() <= 0.25

# Row terminators are pseudo-tokens: the root's final ")" fused with "\t<label>\r\n". The
# generator writes token ids >= _ROW_END_ID + label for them so one vectorised pass makes bytes.
_ROW_END_ID = VOCAB_SIZE
_TOKEN_BYTES = [b""] + [tok.encode() + b" " for tok in VOCAB[1:]]
_TOKEN_BYTES += [b")\t%d\r\n" % label for label in range(NUM_CLASSES)]
_TOKEN_LEN = np.array([len(b) for b in _TOKEN_BYTES], dtype=np.int64)
_TOKEN_TABLE = np.zeros((len(_TOKEN_BYTES), int(_TOKEN_LEN.max())), dtype=np.uint8)
for _i, _b in enumerate(_TOKEN_BYTES):
    _TOKEN_TABLE[_i, : len(_b)] = np.frombuffer(_b, dtype=np.uint8)


@dataclass(frozen=True)
class ListOpsConfig(GeneratorConfig):
    """Generation parameters (release defaults). Lengths count operators, digits and ``]``."""

    n_train: int = 96_000
    n_val: int = 2_000
    n_test: int = 2_000
    min_len: int = 500
    max_len: int = 2000
    max_depth: int = 10
    max_args: int = 10
    FORMAT: ClassVar[str] = "lra-listops-v1"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_depth < 2 or self.max_args < 2:
            raise DataError("listops: max_depth and max_args must be >= 2")
        if not 0 <= self.min_len < self.max_len - 1:
            raise DataError(
                f"listops: need 0 <= min_len < max_len - 1, got {self.min_len}, {self.max_len}"
            )


# --------------------------------------------------------------------------- evaluation


def _apply(op: str, args: list[int]) -> int:
    if len(args) == 0:
        raise DataError(f"listops: operator {op} without arguments")
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == SM:
        return sum(args) % 10
    s = sorted(args)
    n = len(s)
    # int(np.median(args)) of non-negative ints: floor of the mean of the two middle values.
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def evaluate(expression: str) -> int:
    """Value of a ListOps expression, with or without the release's parentheses.

    ``evaluate("[MAX 4 3 [MIN 2 3 ] 1 0 ]") == 4``;
    ``evaluate("( ( ( [SM 5 ) 7 ) ] )") == 2``. Raises DataError on malformed input.
    """
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in expression.split():
        if tok in ("(", ")"):
            continue
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == END:
            if not stack:
                raise DataError(f"listops: unbalanced ']' in {expression[:80]!r}")
            op, args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            elif result is None:
                result = value
            else:
                raise DataError("listops: more than one top-level expression")
        elif len(tok) == 1 and tok.isdigit():
            if stack:
                stack[-1][1].append(int(tok))
            elif result is None:
                result = int(tok)
            else:
                raise DataError("listops: more than one top-level expression")
        else:
            raise DataError(f"listops: unknown token {tok!r}")
    if stack or result is None:
        raise DataError(f"listops: incomplete expression {expression[:80]!r}")
    return result


def tokenize(expression: str, keep_parens: bool = False) -> np.ndarray:
    """Token ids (n,) uint8 of an expression in the fixed vocabulary (see module docstring)."""
    ids = []
    for tok in expression.split():
        if tok not in TOKEN_TO_ID or tok == "<pad>":
            raise DataError(f"listops: unknown token {tok!r}")
        if keep_parens or tok not in ("(", ")"):
            ids.append(TOKEN_TO_ID[tok])
    return np.array(ids, dtype=np.uint8)


def detokenize(ids: np.ndarray) -> str:
    """Inverse of :func:`tokenize` (padding ids are skipped)."""
    return " ".join(VOCAB[int(i)] for i in ids if int(i) != PAD_ID)


# --------------------------------------------------------------------------- generation


def _excl_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.size, dtype=np.int64)
    np.cumsum(x[:-1], out=out[1:])
    return out


def _ramp(counts: np.ndarray) -> np.ndarray:
    """For counts (m,), the concatenation of arange(c) for each c (vectorised)."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(_excl_cumsum(counts), counts)


def _group_values(
    opcode: np.ndarray, k: np.ndarray, child_val: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Values of operator nodes from their children's values.

    Children of the m operators are consecutive runs of lengths ``k`` (m,) in ``child_val``.
    Returns (values (m,), run starts (m,)).
    """
    starts = _excl_cumsum(k)
    vmin = np.minimum.reduceat(child_val, starts)
    vmax = np.maximum.reduceat(child_val, starts)
    vsum = np.add.reduceat(child_val, starts) % 10
    # Median of digits without sorting: per-group digit histograms, then the digits at ranks
    # (k - 1) // 2 and k // 2 are the first whose cumulative count exceeds the rank.
    m = k.size
    hist = np.bincount(np.repeat(np.arange(m) * 10, k) + child_val, minlength=m * 10)
    cum = np.cumsum(hist.reshape(m, 10), axis=1)
    lo = np.argmax(cum > ((k - 1) // 2)[:, None], axis=1)
    hi = np.argmax(cum > (k // 2)[:, None], axis=1)
    vmed = (lo + hi) // 2
    return np.choose(opcode, [vmin, vmax, vmed, vsum]), starts


def _generate_batch(
    rng: np.random.Generator, n_roots: int, cfg: ListOpsConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw ``n_roots`` operator-rooted trees and serialise the kept ones.

    Returns (tokens (T,) int64 full-format token ids with row terminators fused in,
    row_offsets (m + 1,) int64 into tokens, labels (m,) int64) for the m kept trees.
    """
    # Level arrays (depth 1 = roots): (is_op, k, opcode, digit, tree) per level. Nodes of a
    # level are ordered by parent, so the children of the j-th operator of a level form the
    # j-th run of the next level.
    tree = np.arange(n_roots, dtype=np.int64)
    k = rng.integers(2, cfg.max_args + 1, n_roots)
    opc = rng.integers(0, 4, n_roots)
    raw = [(np.ones(n_roots, dtype=bool), k, opc, np.zeros(n_roots, np.int64), tree)]
    length = np.full(n_roots, 2, dtype=np.int64)  # operator + its "]"
    alive = np.ones(n_roots, dtype=bool)
    for depth in range(2, cfg.max_depth + 1):
        op_prev, k_prev, _, _, tree_prev = raw[-1]
        expand = op_prev & alive[tree_prev]
        tree = np.repeat(tree_prev[expand], k_prev[expand])
        n = tree.size
        if n == 0:
            break
        op = rng.random(n) <= OP_PROB if depth < cfg.max_depth else np.zeros(n, dtype=bool)
        k = np.where(op, rng.integers(2, cfg.max_args + 1, n), 0)
        raw.append((op, k, rng.integers(0, 4, n), rng.integers(0, 10, n), tree))
        length += np.bincount(tree, weights=np.where(op, 2, 1), minlength=n_roots).astype(np.int64)
        alive &= length < cfg.max_len  # abandon: the release would reject it anyway
    keep = alive & (length > cfg.min_len)
    n_kept = int(keep.sum())
    if n_kept == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64)

    # Keep only nodes of kept trees; kept trees were alive at every expansion, so their child
    # runs stay aligned with their operators.
    levels = [(o[keep[t]], kk[keep[t]], oc[keep[t]], dg[keep[t]]) for o, kk, oc, dg, t in raw]

    # Bottom-up: full-format size (tokens incl. parentheses) and value of every node.
    sizes: list[np.ndarray] = [np.empty(0)] * len(levels)
    values: list[np.ndarray] = [np.empty(0)] * len(levels)
    for d in range(len(levels) - 1, -1, -1):
        o, kk, oc, dg = levels[d]
        size = np.ones(o.size, dtype=np.int64)
        val = dg.copy()
        if o.any():
            kop = kk[o]
            val[o], starts = _group_values(oc[o], kop, values[d + 1])
            size[o] = 2 * kop + 4 + np.add.reduceat(sizes[d + 1], starts)
        sizes[d], values[d] = size, val

    # Top-down: position of every node in the flat output, then scatter its tokens. Only
    # "(" runs, operators, "]" and digits are written; every other slot is a ")".
    row_offsets = np.zeros(n_kept + 1, dtype=np.int64)
    np.cumsum(sizes[0], out=row_offsets[1:])
    tokens = np.full(int(row_offsets[-1]), RPAREN_ID, dtype=np.int64)
    pos = row_offsets[:-1].copy()
    for d in range(len(levels)):
        o, kk, oc, dg = levels[d]
        leaf = ~o
        tokens[pos[leaf]] = DIGIT0_ID + dg[leaf]
        if not o.any():
            break
        p, kop, size = pos[o], kk[o], sizes[d][o]
        tokens[np.repeat(p, kop + 1) + _ramp(kop + 1)] = LPAREN_ID  # k + 1 "("
        tokens[p + kop + 1] = OP0_ID + oc[o]
        tokens[p + size - 2] = END_ID
        # Child j of an operator at p starts at p + k + 2 + sum_{i<j} (size_i + 1): each
        # earlier child is followed by its closing ")".
        child_size = sizes[d + 1] + 1
        excl = np.cumsum(child_size) - child_size
        starts = _excl_cumsum(kop)
        pos = np.repeat(p + kop + 2, kop) + excl - np.repeat(excl[starts], kop)
    labels = values[0].astype(np.int64)
    tokens[row_offsets[1:] - 1] = _ROW_END_ID + labels
    return tokens, row_offsets, labels


def _tokens_to_bytes(tokens: np.ndarray) -> np.ndarray:
    """Bytes (uint8) of the TSV rows for full-format tokens (row terminators fused in)."""
    lens = _TOKEN_LEN[tokens]
    offs = np.zeros(tokens.size + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    starts = offs[:-1]
    out = np.empty(int(offs[-1]), dtype=np.uint8)
    # Every token has >= 2 bytes ("7 ", "( ", ...); only operators and row ends are longer,
    # so the byte columns past the second are written for that small subset only.
    out[starts] = _TOKEN_TABLE[tokens, 0]
    out[starts + 1] = _TOKEN_TABLE[tokens, 1]
    long_tok = np.flatnonzero(lens > 2)
    for c in range(2, _TOKEN_TABLE.shape[1]):
        sub = long_tok[lens[long_tok] > c]
        out[starts[sub] + c] = _TOKEN_TABLE[tokens[sub], c]
    return out


def iter_split_batches(
    cfg: ListOpsConfig, split: str, roots_per_batch: int = 1024
) -> Iterator[tuple[bytes, np.ndarray]]:
    """Yield (TSV row bytes, labels (m,)) batches of the split's deterministic example stream.

    The stream is infinite; callers take as many rows as they need.
    """
    split_index = SPLITS.index(split)
    for batch_index in range(1 << 62):
        rng = np.random.default_rng([cfg.seed, split_index, batch_index])
        tokens, _, labels = _generate_batch(rng, roots_per_batch, cfg)
        if labels.size == 0:
            if batch_index >= 64:
                raise DataError(
                    f"listops: no tree with {cfg.min_len} < length < {cfg.max_len} in "
                    f"{64 * roots_per_batch} draws; widen the length bounds"
                )
            continue
        yield _tokens_to_bytes(tokens).tobytes(), labels


def _row_bytes_split(data: bytes, n_rows: int) -> bytes:
    """The first ``n_rows`` CRLF-terminated rows of ``data``."""
    end = -1
    for _ in range(n_rows):
        end = data.index(b"\n", end + 1)
    return data[: end + 1]


def write_split(path: str | os.PathLike[str], cfg: ListOpsConfig, split: str) -> Path:
    """Generate ``split`` (its size in cfg) into ``path`` in the release TSV format, atomically."""
    n = cfg.split_size(split)
    path = Path(path)
    with atomic_writer(path, "wb") as f:
        f.write(HEADER)
        done = 0
        for data, labels in iter_split_batches(cfg, split):
            if done >= n:
                break
            take = min(labels.size, n - done)
            f.write(data if take == labels.size else _row_bytes_split(data, take))
            done += take
    return path


def ensure_listops_files(
    cache_dir: str | os.PathLike[str] | None = None,
    cfg: ListOpsConfig | None = None,
    splits: tuple[str, ...] = SPLITS,
) -> dict[str, Path]:
    """Paths of generated ``basic_{split}.tsv`` files, generating only the missing ones.

    Files live in ``<cache_dir>/listops-<hash of generation params>/`` and are named
    ``basic_<split>-<n>.tsv`` (n = split size), so other sizes or parameters never clash.
    """
    cfg = cfg or ListOpsConfig()
    return ensure_generated(
        cache_dir,
        "listops",
        cfg,
        splits,
        lambda split, n: f"basic_{split}-{n}.tsv",
        lambda path, split: write_split(path, cfg, split),
    )


# --------------------------------------------------------------------------- reading

# First byte of a token -> id; "[" needs the third byte ("[MAX" -> "A", "[SM" -> "M").
_FIRST_BYTE = np.full(256, -1, dtype=np.int64)
for _d in range(10):
    _FIRST_BYTE[ord(str(_d))] = DIGIT0_ID + _d
_FIRST_BYTE[ord("]")], _FIRST_BYTE[ord("(")], _FIRST_BYTE[ord(")")] = END_ID, LPAREN_ID, RPAREN_ID
_BRACKET_THIRD = np.full(256, -1, dtype=np.int64)
for _name, _op in zip("IAEM", OPERATORS, strict=True):  # m[I]n m[A]x m[E]d s[M]
    _BRACKET_THIRD[ord(_name)] = TOKEN_TO_ID[_op]


def _parse_chunk(buf: np.ndarray, keep_parens: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse whole TSV rows in ``buf`` (uint8, ends with b"\\n", no header; LF or CRLF).

    Returns (ids (T,) uint8, per-row token counts (m,), labels (m,)); blank lines are skipped.
    """
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], nl[:-1] + 1))
    content_end = nl - (buf[np.maximum(nl - 1, 0)] == 13) * (nl > starts)
    rows = np.flatnonzero(starts < content_end)
    tabs = np.flatnonzero(buf == 9)
    if tabs.size != rows.size or np.any(np.searchsorted(nl, tabs) != rows):
        raise DataError("listops: every row must be '<expression><TAB><label>'")
    try:
        labels = np.array([int(bytes(buf[t + 1 : e])) for t, e in zip(tabs, nl[rows], strict=True)])
    except ValueError as exc:
        raise DataError(f"listops: bad label ({exc})") from None
    # A token starts at a printable byte after a space or a line start; the label (after the
    # tab) is thereby excluded.
    after_sep = np.empty(buf.size, dtype=bool)
    after_sep[0] = True
    after_sep[1:] = (buf[:-1] == 32) | (buf[:-1] == 10)
    tok_pos = np.flatnonzero(after_sep & (buf > 32))
    first = buf[tok_pos]
    ids = _FIRST_BYTE[first]
    br = first == ord("[")
    ids[br] = _BRACKET_THIRD[buf[np.minimum(tok_pos[br] + 2, buf.size - 1)]]
    if np.any(ids < 0):
        bad = int(tok_pos[np.argmax(ids < 0)])
        raise DataError(f"listops: unknown token starting {bytes(buf[bad : bad + 8])!r}")
    kept = np.ones(ids.size, dtype=bool) if keep_parens else (ids != LPAREN_ID) & (ids != RPAREN_ID)
    before = np.zeros(ids.size + 1, dtype=np.int64)
    before[1:] = np.cumsum(kept, dtype=np.int64)
    counts = before[np.searchsorted(tok_pos, tabs)] - before[np.searchsorted(tok_pos, starts[rows])]
    return ids[kept].astype(np.uint8), counts, labels


def read_listops_tsv(
    path: str | os.PathLike[str], keep_parens: bool = False, chunk_bytes: int = 1 << 24
) -> tuple[RaggedSequences, np.ndarray]:
    """Read a ListOps TSV (this generator's or the release's ``basic_*.tsv``).

    Header ``Source<TAB>Target`` is skipped if present; LF or CRLF line ends. Parsing is
    vectorised over 16 MB chunks. Returns (token id sequences (n_i,) uint8, labels (n,) int64).
    """
    path = require_path(path, "a ListOps TSV file (Source<TAB>Target)")
    ids_parts, count_parts, label_parts = [], [], []
    with reading(path, "data.path", "a ListOps TSV file"), open(path, "rb") as f:
        first = f.readline()
        rest = b"" if first.split(b"\t")[0].strip() == b"Source" else first
        while True:
            block = f.read(chunk_bytes)
            data = rest + block
            if not block:
                if data and not data.endswith(b"\n"):
                    data += b"\n"
                cut = len(data)
            else:
                cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            buf = np.frombuffer(data[:cut], dtype=np.uint8)
            if buf.size:
                ids, counts, labels = _parse_chunk(buf, keep_parens)
                ids_parts.append(ids), count_parts.append(counts), label_parts.append(labels)
            if not block:
                break
    if not label_parts:
        return RaggedSequences(np.zeros(0, np.uint8), np.zeros(1, np.int64)), np.zeros(0, np.int64)
    counts = np.concatenate(count_parts)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return RaggedSequences(np.concatenate(ids_parts), offsets), np.concatenate(label_parts)


# --------------------------------------------------------------------------- datasets


def official_split_paths(data_dir: str | os.PathLike[str], task: str = "basic") -> dict[str, Path]:
    """``{split: <data_dir>/<task>_<split>.tsv}`` of the release (``listops-1000/``)."""
    root = require_path(data_dir, "a folder with basic_train.tsv, basic_val.tsv, basic_test.tsv")
    return {s: require_file(root / f"{task}_{s}.tsv", "ListOps file") for s in SPLITS}


def load_listops(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    config: ListOpsConfig | None = None,
    max_len: int = 2000,
    keep_parens: bool = False,
    pad_to_max_len: bool = False,
) -> TaskData:
    """ListOps train/val/test datasets of ``(ids (n,), label)`` with labels 0..9.

    ``data_dir`` given: read the release files ``basic_{train,val,test}.tsv`` from it.
    ``data_dir`` None: generate (or reuse) files in ``cache_dir`` with ``config``.
    The collate truncates to ``max_len`` and pads with id 0.
    """

    def read(path: Path) -> tuple[RaggedSequences, np.ndarray]:
        return read_listops_tsv(path, keep_parens=keep_parens)

    if data_dir is not None:
        arrays = {split: read(path) for split, path in official_split_paths(data_dir).items()}
        dataset = "ListOps (release)"
    else:
        cfg = config or ListOpsConfig()
        arrays = read_generated_splits(
            cfg, lambda splits: ensure_listops_files(cache_dir, cfg, splits), read
        )
        dataset = "ListOps (generated)"
    sets = {split: SequenceClassificationDataset(*pair) for split, pair in arrays.items()}
    collate = ClassificationCollate(max_len, PAD_ID, pad_to_max_len)
    return TaskData.from_splits(sets, VOCAB_SIZE, NUM_CLASSES, collate, dataset)


def _benchmark(n: int = 96_000) -> None:  # pragma: no cover - manual timing helper
    """``python -m nyscli.data.listops [n]``: time generating and reading n train examples."""
    import sys
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else n
    cfg = ListOpsConfig(n_train=n, n_val=0, n_test=0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = ensure_listops_files(tmp, cfg, splits=("train",))["train"]
        t1 = time.perf_counter()
        seqs, labels = read_listops_tsv(path)
        t2 = time.perf_counter()
        size = path.stat().st_size
    lens = seqs.lengths
    print(f"generate+write {n}: {t1 - t0:.1f}s ({size / 1e6:.0f} MB); read: {t2 - t1:.1f}s")
    print(f"lengths min/mean/max {lens.min()}/{lens.mean():.0f}/{lens.max()}")
    print(f"label counts {np.bincount(labels, minlength=10).tolist()}")


if __name__ == "__main__":  # pragma: no cover
    _benchmark()
