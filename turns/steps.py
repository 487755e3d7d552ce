"""The steps of a turn's run (``turns.turn_run.TurnRun``), named apart so the modules that
carry some of its steps can return them."""

from __future__ import annotations

import enum


class Step(enum.Enum):
    START = "start"
    ADMIT = "admit"
    CALL = "call"
    SETTLE = "settle"
    WAIT = "wait"
    END = "end"
