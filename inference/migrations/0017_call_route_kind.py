"""A call row's route as a value (``route_kind``), read by code instead of its words; the rows
written before it get theirs from those words."""

from django.db import migrations, models

BACKFILL = """
UPDATE inference_inferencecall SET route_kind = CASE
    WHEN route LIKE 'fallback%' THEN 'fallback'
    WHEN route LIKE 'hedge%' THEN 'hedge'
    WHEN route LIKE 'return to primary%' THEN 'returning'
    WHEN route LIKE 'pool%' THEN 'pool'
    ELSE 'primary' END
WHERE route NOT LIKE 'primary%' AND route <> ''
"""


class Migration(migrations.Migration):
    dependencies = [("inference", "0016_capacity_call_paced_ms")]

    operations = [
        migrations.AddField(
            model_name="inferencecall",
            name="route_kind",
            field=models.CharField(
                choices=[
                    ("primary", "primary"),
                    ("fallback", "fallback"),
                    ("returning", "returning"),
                    ("hedge", "hedge"),
                    ("pool", "pool"),
                ],
                default="primary",
                max_length=16,
            ),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
