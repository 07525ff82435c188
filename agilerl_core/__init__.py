"""agilerl_core: the evolutionary RL engine (pure PyTorch + Gymnasium, no orchestration imports)."""

__version__ = "0.1.0"
