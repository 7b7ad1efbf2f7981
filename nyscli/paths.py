"""Where the Hydra configs live; no heavy imports, so ``nys --help`` and completion stay fast."""

from __future__ import annotations

import os
from pathlib import Path

# The configs ship inside the package (nyscli/conf), so a wheel works from any directory.
CONF_DIR = Path(os.environ.get("NYS_CONF_DIR", Path(__file__).resolve().parent / "conf"))
