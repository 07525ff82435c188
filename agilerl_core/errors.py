"""Errors raised for bad user input. Each message names the offending field or file and the fix."""


class AgileRLError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(AgileRLError):
    """An experiment config (or an env it names) is invalid; raised before any work starts."""


class CheckpointError(AgileRLError):
    """A checkpoint file is missing, truncated, tampered with or not one of ours."""


class StorageError(AgileRLError):
    """A storage URI, bucket or credential is wrong, or the store cannot be reached."""


class LeaseError(AgileRLError):
    """Another process holds the run's writer lease; names the owner and how to proceed."""


class TrackingError(AgileRLError):
    """The experiment tracker (MLflow) cannot be reached or refused a request."""


class DatasetError(ConfigError):
    """An offline dataset is missing, truncated, malformed or does not fit the env; names the key and the fix."""
