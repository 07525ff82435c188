"""The memory budget of one data file as it is read and decoded (prompt, preference and game sets; bandit tables):
its file size times ``limits.dataset_expansion``, capped by ``limits.dataset_bytes``; one record's text against
``limits.record_bytes``; its records against ``limits.dataset_records``. Readers charge what they are about to
allocate before they allocate it, so a small file that decodes to gigabytes is refused, naming the file, the
limit and how to raise it."""

from __future__ import annotations

from agilerl_core import limits as _limits
from agilerl_core.errors import DatasetError


class ReadBudget:
    """The budget of the file `label` names (``dataset URI``, ``data.source SOURCE``), `size` bytes on disk; `kind`
    and `unit` name it and its records in refusals (``set`` of ``records``, ``table`` of ``rows``); `per_record`:
    bytes a record costs in memory beyond its text (a reader's own estimate, charged by the reader)."""

    def __init__(self, label: str, size: int, kind: str, unit: str, per_record: int = 0) -> None:
        lim = _limits.current()
        self.label, self.size, self.kind, self.unit, self.lim = label, size, kind, unit, lim
        self.per_record = per_record
        by_size = max(size, 1) * lim.dataset_expansion
        self.total = min(by_size, lim.dataset_bytes)
        self.limit_name = "dataset_expansion" if by_size <= lim.dataset_bytes else "dataset_bytes"
        self.used = 0

    def count(self, n: int, where: str) -> None:
        """Refuse `n` records (seen or declared, as `where` says) over ``limits.dataset_records``."""
        if n > self.lim.dataset_records:
            raise DatasetError(f"{self.label}: {n:,} {self.unit} {where}, over the limit limits.dataset_records = "
                               f"{self.lim.dataset_records:,}; if the {self.kind} is meant, raise "
                               f"limits.dataset_records in your own config (or split the {self.kind})")

    def text(self, nbytes: int, what: str) -> None:
        """Refuse `what` (one record, one value) holding `nbytes` of text over ``limits.record_bytes``."""
        if nbytes > self.lim.record_bytes:
            raise DatasetError(f"{self.label}: {what} holds {nbytes:,} bytes of text, over the limit "
                               f"limits.record_bytes = {self.lim.record_bytes:,}; if such {self.unit} are meant, "
                               f"raise limits.record_bytes in your own config")

    def spend(self, nbytes: int, where: str) -> None:
        """Count `nbytes` more against the budget (before they are allocated); refused past it."""
        self.used += nbytes
        if self.used > self.total:
            how = (f"{self.size:,} bytes of file x limits.dataset_expansion = {self.lim.dataset_expansion:,}"
                   if self.limit_name == "dataset_expansion" else
                   f"limits.dataset_bytes = {self.lim.dataset_bytes:,}")
            raise DatasetError(f"{self.label}: its {self.unit} come to more than {self.total:,} bytes in memory "
                               f"{where} ({how}); a small file that expands this far is damaged or hostile. If the "
                               f"{self.kind} is genuine, raise limits.{self.limit_name} in your own config")

    def peek(self, nbytes: int, where: str) -> None:
        """Refuse `nbytes` more that would pass the budget, without keeping them counted (a transient buffer)."""
        self.spend(nbytes, where)
        self.used -= nbytes
