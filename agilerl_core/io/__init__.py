"""Safe persistence: safetensors + JSON checkpoints.

The checkpoint functions load on first use, so that the light readers of this package (``io.files``,
``io.records``) can be imported without torch (a config error prints before any heavy import)."""

from typing import Any

__all__ = ["load_member", "load_population", "save_member", "save_population"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agilerl_core.io import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
