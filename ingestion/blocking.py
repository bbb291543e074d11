"""Whether a check outcome blocks ingestion, and a fingerprint of its cause (pure).

A blocking check (``group_id_consistency``) that fails with ERROR stops ingestion: nothing may
be read until the cause is fixed. The lag sensor, the fallback schedule and the alert policy
ask the same question of the same outcome; the fingerprint lets them act once per cause.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """What a check said: passed or not, how bad, and its message (the cause and the fix).

    Built from an engine ``Finding`` or from a stored Dagster evaluation alike.
    """

    passed: bool
    severity: str
    message: str

    @property
    def blocks(self) -> bool:
        """A failure with ERROR severity: a blocking check stops ingestion on it.

        Example:
            >>> Outcome(False, "ERROR", "x").blocks, Outcome(False, "WARN", "x").blocks
            (True, False)
        """
        return not self.passed and self.severity == "ERROR"

    @property
    def fingerprint(self) -> str:
        """Stable while the cause is the same: the check messages name ids and partitions,
        never offsets or times, so a new fingerprint means a new cause (or its fix).

        Example:
            >>> Outcome(False, "ERROR", "a").fingerprint == Outcome(False, "ERROR", "a").fingerprint
            True
            >>> Outcome(False, "ERROR", "a").fingerprint == Outcome(False, "ERROR", "b").fingerprint
            False
        """
        text = f"{self.passed}|{self.severity}|{self.message}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]
