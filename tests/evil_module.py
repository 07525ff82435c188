"""A module that must never be imported by loading a checkpoint or by a flow-run parameter: importing it (or
calling what it defines) leaves a marker file that the trust tests look for."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

MARKER = Path(os.environ.get("AGILERL_TEST_MARKER") or Path(tempfile.gettempdir()) / "agilerl-evil-module-imported")
MARKER.write_text("imported")


def run(*args, **kwargs):
    MARKER.write_text("called")


class Env:
    def __init__(self, *args, **kwargs):
        run()
