"""MkDocs hook: docstrings cross-reference with Sphinx roles (``:meth:`Evolution.save```, ``:class:`~a.b.C```),
which mkdocstrings' Google-style rendering leaves as literal text before a code span. Rendered here as the code
span alone (a ``~`` shows the last name only, as Sphinx does)."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:meth|func|class|attr|mod|data|exc|obj|const|paramref):<code>(~?)([^<]+)</code>")


def render_roles(html: str) -> str:
    """`html` with every role-prefixed code span reduced to the code span."""
    return _ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)


def on_page_content(html: str, **_kwargs) -> str:
    return render_roles(html)
