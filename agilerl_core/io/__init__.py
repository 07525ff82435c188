"""Safe persistence: safetensors + JSON checkpoints."""

from agilerl_core.io.checkpoint import load_member, load_population, save_member, save_population

__all__ = ["load_member", "load_population", "save_member", "save_population"]
