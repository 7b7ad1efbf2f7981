"""The attention core's GPU ops: one module per op, its Triton kernels beside it.

| module | what it holds |
|---|---|
| ``gates.py`` | the one immutable ``Gates`` value: which paths may run, launch settings |
| ``dtypes.py`` | the dtype rules (operands, compute, rounding, products) on the torch side |
| ``ops.py`` | ``Launch`` (a kernel launch stated once), ``kernels_serve``, custom ops, ``OPS`` |
| ``helpers.py`` | the Triton helpers every kernel shares: ``product``, ``rounded`` |
| ``landmark.py`` + ``landmark_kernels.py`` | W = pinv(A) Bk V, forward and backward; the pinv |
| ``inference.py`` + ``inference_kernels.py`` | Nyström at inference in four kernels |
| ``hybrid.py`` + ``hybrid_kernels.py`` | the Nyström-local hybrid's forward |
| ``graphs.py`` | CUDA graphs of an inference call |
| ``reference.py`` | the torch functions the ops are held to |

An op module registers itself in ``ops.OPS`` when imported; ``ops.load_all`` imports them all
(what ``scripts/compile_check.py`` compiles) without importing triton. Adding a kernel:
docs/design.md, "Adding a GPU kernel".
"""
