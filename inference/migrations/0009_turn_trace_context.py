# A turn's span across processes (architecture.md §16, agentops.telemetry): nullable, so adding it
# rewrites no row.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0008_turn_waiting_reason'),
    ]

    operations = [
        migrations.AddField(
            model_name='turn',
            name='trace_context',
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
