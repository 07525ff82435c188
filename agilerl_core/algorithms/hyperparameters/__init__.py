"""Every algorithm's hyperparameters (pydantic models, one module per family): what a config's
``hyperparameters`` section holds and which of them mutate. Importing them never imports an implementation."""
