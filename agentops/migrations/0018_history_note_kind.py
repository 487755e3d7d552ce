"""Which of the service's notes a system note is, as a value (``note_kind``) rather than read
back from its text's prefix; the notes written before it get theirs from that prefix."""

from django.db import migrations, models

BACKFILL = """
UPDATE agentops_historyrow SET note_kind = CASE
    WHEN content #>> '{}' LIKE '[inference-failed]%' THEN 'failed'
    WHEN content #>> '{}' LIKE '[refusal-rewind]%' THEN 'shed'
    WHEN content #>> '{}' LIKE '[context-trim]%' THEN 'trim'
    WHEN content #>> '{}' LIKE '[context-summary]%' THEN 'summary'
    ELSE '' END
WHERE role = 'system-note' AND jsonb_typeof(content) = 'string'
"""


class Migration(migrations.Migration):
    dependencies = [("agentops", "0017_agent_hedge_after_ms")]

    operations = [
        migrations.AddField(
            model_name="historyrow",
            name="note_kind",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "none"),
                    ("failed", "Failed"),
                    ("shed", "Shed"),
                    ("trim", "Trim"),
                    ("summary", "Summary"),
                ],
                default="",
                max_length=10,
            ),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
