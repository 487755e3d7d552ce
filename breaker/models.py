"""The breaker's per-agent state (architecture.md §7): the failure streak, this run's sheds and
marker note, and the probe that may be out."""

from __future__ import annotations

from django.db import models

from agentops.models import Agent, HistoryRow


class BreakerState(models.Model):
    class ProbeStatus(models.TextChoices):
        NONE = "", "none"
        OUT = "out"
        ANSWERED = "answered"
        REFUSED = "refused"
        UNCLEAR = "unclear"
        SET_ASIDE = "set_aside"
        WITHDRAWN = "withdrawn"
        ABORTED = "aborted"

    agent = models.OneToOneField(
        Agent, on_delete=models.CASCADE, primary_key=True, related_name="breaker"
    )
    streak = models.PositiveIntegerField(default=0)
    # Bumped on every change of the streak, so a probe can tell "moved and moved back" from
    # "never moved" (architecture.md §7.3).
    streak_version = models.PositiveBigIntegerField(default=0)
    sheds_this_run = models.PositiveIntegerField(default=0)
    # The run's one [refusal-rewind] note, updated in place on each shed; None starts a new one.
    marker_row = models.ForeignKey(
        HistoryRow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    probe_status = models.CharField(
        max_length=20, choices=ProbeStatus.choices, blank=True, default=""
    )
    probe_sent_at = models.DateTimeField(null=True, blank=True)
    probe_verdict = models.TextField(blank=True, default="")
    probe_id = models.UUIDField(null=True, blank=True)
    probe_snapshot = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "breaker state"
        permissions = [("restore_historyrow", "Can restore a set-aside history row")]

    def __str__(self) -> str:
        return f"breaker of agent {self.agent_id}: streak {self.streak}"
