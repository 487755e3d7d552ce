"""The provider-waits journal (architecture.md §6.1): append-only rows, one per act.

The service only ever inserts rows (``waits.journal``), with ``INSERT ... ON CONFLICT (act_id)
DO NOTHING`` so a replay after an ambiguous commit never applies twice. It never updates or
deletes one. The columns are not trusted on read: every row is validated by
``waits.core.entry_parse`` and a row that is not a well-formed wait makes the records
unreadable (§6.5), so ``kind`` deliberately has no database choices constraint.
"""

from __future__ import annotations

from django.db import models


class WaitJournalEntry(models.Model):
    class Kind(models.TextChoices):
        SET = "set", "wait set"
        RELEASE = "release", "wait released"
        CHECKPOINT = "checkpoint", "checkpoint"

    # The act's own id: a pending act offered again after an ambiguous write carries the same
    # one, so the second insert does nothing.
    act_id = models.UUIDField(unique=True)
    kind = models.CharField(max_length=20)
    agent = models.CharField(max_length=100, blank=True, default="")
    # A model name; "*" (every model) in a release.
    model = models.CharField(max_length=200, blank=True, default="")
    # The provider the model was called on, when it is not the agent's own (an alternate's,
    # architecture.md §6.11); "" is the agent's own provider, as in every row written before
    # alternates existed. A release with "" lifts the model on every provider.
    provider = models.CharField(max_length=100, blank=True, default="", db_default="")
    # The wait's deadline in ms since the epoch; null holds until released (§6.2).
    until_ms = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    by = models.CharField(max_length=220, blank=True, default="")
    # When the act was decided (the ``now`` it was decided at), not when the row landed.
    at = models.DateTimeField()
    # A checkpoint's snapshot: {"waits": [{agent, model, until, reason, set_at}], "through": id}.
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "provider-wait journal entry"
        verbose_name_plural = "provider-wait journal"
        indexes = [
            models.Index(fields=["agent", "id"], name="waits_journal_agent"),
            # A full read starts at the latest checkpoint.
            models.Index(
                fields=["id"],
                condition=models.Q(kind="checkpoint"),
                name="waits_journal_checkpoints",
            ),
        ]
        permissions = [("release_wait", "Can release provider waits")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind} {self.agent} {self.model}".strip()


class BindingWait(WaitJournalEntry):
    """The admin's "Binding waits" page (a list computed from the journal, with Release)."""

    class Meta:
        proxy = True
        verbose_name = "binding wait"
        verbose_name_plural = "binding waits"
