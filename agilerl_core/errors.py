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


class NonFiniteError(AgileRLError):
    """A member's training met a non-finite value (NaN or inf): a reward, an observation, a loss or a weight.
    Names where it came from (the env or dataset), the member (id and slot), the step and the value; raised
    before anything of the generation is committed."""

    def __init__(self, source: str | None, slot: int, what: str, step: int | None = None, step_kind: str = "env step",
                 member_id: int | None = None, generation: int | None = None) -> None:
        self.source, self.slot, self.what, self.step, self.step_kind = source, slot, what, step, step_kind
        self.member_id, self.generation = member_id, generation
        super().__init__(self._message())

    def _message(self) -> str:
        slot = f"slot {self.slot}" if self.slot >= 0 else "no slot"
        who = slot if self.member_id is None else f"member {self.member_id} ({slot})"
        gen = "" if self.generation is None else f" of generation {self.generation}"
        at = "" if self.step is None else f" at {self.step_kind} {self.step} of its training phase"
        return (f"{self.source or 'training'}: {who}{gen}: {self.what} is not finite (NaN or inf){at}; the run "
                f"stopped before committing or saving it (the last committed generation is intact): fix the env, "
                f"dataset or hyperparameters (e.g. a lower learning rate), then resume")

    def named(self, source: str | None, member_id: int | None, generation: int | None) -> "NonFiniteError":
        """The same error naming the source (env or dataset), the member's id and its generation (what the
        evolution knows, the arena's loop not)."""
        return NonFiniteError(self.source or source, self.slot, self.what, self.step, self.step_kind, member_id,
                              self.generation if generation is None else generation)

    def __reduce__(self):  # travels between processes (Dask, Ray) with its fields
        return (NonFiniteError, (self.source, self.slot, self.what, self.step, self.step_kind, self.member_id,
                                 self.generation))


class BudgetWarning(UserWarning):
    """A config's step budget pays for too few generations to evolve (``evolve`` warns once, before training)."""
