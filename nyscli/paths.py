"""Where the Hydra configs live and where runs are written.

No heavy imports, so ``nys --help`` and completion stay fast.
"""

from __future__ import annotations

from pathlib import Path

# The configs ship inside the package (nyscli/conf), so a wheel works from any directory:
# Hydra reads them as a package resource (CONF_SOURCE); CONF_DIR is the same folder on disk.
CONF_SOURCE = "pkg://nyscli.conf"
CONF_DIR = Path(__file__).resolve().parent / "conf"

# Run folders land under the current directory's outputs/<command>/.
OUTPUT_ROOT = "outputs"

# In a sweep folder: work its jobs share (approx-error's source cache), removed at its end.
SWEEP_CACHE = ".cache"
