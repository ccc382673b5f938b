"""A worker set-up script: make dynlib importable, then build its dynamic modules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dynlib.using_jax  # noqa: E402,F401
