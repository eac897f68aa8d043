"""What one attempt at a task came to: data the runtime records, never an exception to guess about.

A worker (:mod:`orchestration.workers.port`) returns one of these; the pure core turns it into the
fact it records (:mod:`orchestration.core.action_facts`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestration.core.models import Telemetry, TypedError


@dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    output: str
    telemetry: Telemetry
    #: the validated value of ``output`` when the step has an ``output_schema`` (None otherwise)
    value: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AttemptFailedOutcome:
    error: TypedError
    telemetry: Telemetry
    #: when the next attempt may start at the earliest (backoff / retry-after); None: no wait (the
    #: recorded error and the attempt budget still decide whether there is a next attempt)
    not_before: datetime | None = None


AttemptOutcome = AttemptSucceeded | AttemptFailedOutcome
