"""Prefect tasks: thin, typed wrappers over agilerl_core's generation step, plus MLflow tracking."""
