"""Fixtures of the fs tier tests (from :mod:`tiering.fs.testing`); also makes fs_worker importable.

pytest runs with ``--import-mode=importlib``: this folder is put on ``sys.path`` so that test modules can
``from fs_worker import run_worker``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from tiering.fs.testing import io_path, memroot, open_tier, python_io  # noqa: F401  (fixtures)
