"""What every kind of the policy has: a remediation ladder of steps, how long its actions may take,
when a quiet incident closes, and whether its jobs are asked to checkpoint first."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpumedic_incidents.policy.base import HEALTH_URL, Action, MAX_ASKS_WHILE_IN_USE, Strict

FILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ACTION_ROOM_S = 60.0
"""What an action needs of the kind's action_timeout_s once its checkpoint step has waited."""


class Step(Strict):
    """One rung of a remediation ladder."""

    action: Action
    attempts: int = Field(default=1, ge=1, le=10, description="Tries at this step before the next.")
    verify_within_s: float = Field(default=60.0, gt=0, description="How long the samples may take to show it worked.")
    wait_while_in_use_s: float = Field(
        default=0, ge=0, le=7 * 86400,
        description="A refusal only because the target is in use (a GPU reset while a job still holds the GPU) is asked "
        "again every `ask_again_every_s` for this long before a person is called; 0: a person at once.",
    )
    ask_again_every_s: float = Field(default=900.0, ge=60, description="How often a step waiting for its target to be free asks again.")

    @model_validator(mode="after")
    def _asks_within_the_attempt_limit(self) -> Step:
        if self.wait_while_in_use_s / self.ask_again_every_s > MAX_ASKS_WHILE_IN_USE:
            raise ValueError(f"{self.action} would ask {self.wait_while_in_use_s / self.ask_again_every_s:.0f} times while its "
                             f"target is in use; at most {MAX_ASKS_WHILE_IN_USE}: ask less often or wait less")
        return self


class CheckpointPolicy(Strict):
    """Before an action that ends a job's work, the job is told to save it, and waited for: a drain,
    a GPU reset or a reboot asks every job on the node (the reset, its GPU's); a kill asks its
    targets only with `even_when_idle` (they idled for the kind's window: nothing to save)."""

    how: Literal["signal", "file", "http"] = Field(
        description="signal: `signal` to each of the job's processes, done when it exits (a process with no handler for it dies "
        "of it); file: `file` written in each process's working directory, done when the job removes it (or exits); http: "
        "`url` POSTed on the node, done when a GET of it answers 200 (or the job's processes exit).",
    )
    signal: Literal["USR1", "USR2", "INT", "TERM"] = "USR1"
    file: str = Field(default=".gpumedic-checkpoint", max_length=64, description="A file name, no directory.")
    url: str | None = Field(
        default=None, description="The job's hook on the node, for how: http, e.g. http://127.0.0.1:8765/checkpoint: a POST asks "
        "(2xx: asked; 200: already saved), a GET says whether it is saved (200) or still saving (202).",
    )
    wait_s: float = Field(default=120.0, gt=0, le=3600, description="How long the job may take; then the action goes ahead.")
    poll_s: float = Field(default=2.0, ge=0.1, le=10, description="How often the job's answer is looked for meanwhile (each look also tells the bus the action is still running).")
    even_when_idle: bool = Field(default=False, description="Ask a kill's targets too, though they idled for the whole window.")

    @field_validator("file")
    @classmethod
    def _a_plain_name(cls, value: str) -> str:
        if not FILE_NAME.fullmatch(value) or value in (".", ".."):
            raise ValueError(f"file {value!r} is not a plain file name (letters, digits, . _ -; no directory)")
        return value

    @model_validator(mode="after")
    def _a_hook_for_http(self) -> CheckpointPolicy:
        if self.how == "http" and self.url is None:
            raise ValueError("how: http needs url: the job's hook on the node (http://127.0.0.1:PORT/PATH)")
        if self.url is not None and not HEALTH_URL.fullmatch(self.url):
            raise ValueError(f"url {self.url[:100]!r} must be http://127.0.0.1|localhost|[::1][:port][/plain/path] (the hook is called on the node)")
        return self


class KindPolicy(Strict):
    """What every kind has: a ladder (empty: a person from the start), when a quiet incident closes,
    and whether its jobs are asked to checkpoint before an action ends their work (off: not set)."""

    ladder: tuple[Step, ...] = ()
    action_timeout_s: float = Field(default=300.0, gt=0, description="How long to wait for the remediator's answer.")
    clear_after_s: float | None = Field(
        default=None, gt=0, description="Resolved 'cleared' (or, on a drained node, validated) after this long with the fault not seen: no new event, and no sample that still shows it."
    )
    checkpoint: CheckpointPolicy | None = None

    @model_validator(mode="after")
    def _room_for_the_action(self) -> KindPolicy:
        if self.checkpoint is not None and self.checkpoint.wait_s + ACTION_ROOM_S > self.action_timeout_s:
            raise ValueError(
                f"checkpoint.wait_s ({self.checkpoint.wait_s:g}) leaves the action less than {ACTION_ROOM_S:g}s of action_timeout_s "
                f"({self.action_timeout_s:g}): the detector would stop waiting for its answer"
            )
        return self

    @property
    def attempts(self) -> int:
        return sum(step.attempts for step in self.ladder)
