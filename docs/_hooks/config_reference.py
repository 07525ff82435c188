"""MkDocs hook: fills docs/reference/config.md with the reference generated from the config models."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])  # the checkout, importable without an install
MARKER = "<!-- config-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from tasks.config_reference import config_reference

    return markdown.replace(MARKER, config_reference())
