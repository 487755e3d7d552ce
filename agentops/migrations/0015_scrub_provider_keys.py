"""Provider keys out of what was stored before provider text was redacted (architecture.md §15):
the service's notes in history, alerts, the turns' and calls' errors, a provider's last failure,
and webhook deliveries. It can only redact the keys in its own environment when it runs (the
variables ``AGENTOPS_PROVIDER_KEY_ENVS`` allows) and the ``Bearer``/``x-api-key`` forms whatever
their value: run it where the service's provider keys are set (docs/operations.md)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from agentops.providers import provider_keys
from agentops.text import redact_secrets

CHUNK = 2000


def _scrubbed(value: Any, keys: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return redact_secrets(value, keys)
    if isinstance(value, list):
        return [_scrubbed(v, keys) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v, keys) for k, v in value.items()}
    return value


def _scrub(model: Any, fields: tuple[str, ...], keys: tuple[str, ...], **where: Any) -> int:
    """Rewrite ``fields`` of ``model``'s rows (those ``where`` selects) that held a secret; the
    count of rows rewritten."""
    changed = 0
    rows = model.objects.filter(**where).only("pk", *fields).order_by("pk")
    for row in rows.iterator(chunk_size=CHUNK):
        new = {f: _scrubbed(getattr(row, f), keys) for f in fields}
        if any(new[f] != getattr(row, f) for f in fields):
            model.objects.filter(pk=row.pk).update(**new)
            changed += 1
    return changed


def scrub(apps: Any, schema_editor: Any) -> None:
    keys = provider_keys()
    _scrub(apps.get_model("agentops", "HistoryRow"), ("content",), keys, role="system-note")
    _scrub(apps.get_model("agentops", "Alert"), ("message", "data"), keys)
    _scrub(apps.get_model("agentops", "Provider"), ("last_failure",), keys)
    _scrub(apps.get_model("inference", "Turn"), ("error",), keys, error__isnull=False)
    _scrub(apps.get_model("inference", "InferenceCall"), ("error",), keys, error__isnull=False)
    _scrub(apps.get_model("webhooks", "WebhookDelivery"), ("payload", "last_error"), keys)


class Migration(migrations.Migration):
    dependencies = [
        ("agentops", "0014_capacity_agent_pool"),
        ("inference", "0016_capacity_call_paced_ms"),
        ("webhooks", "0002_alter_webhookendpoint_kinds"),
    ]

    operations = [migrations.RunPython(scrub, migrations.RunPython.noop, elidable=True)]
