from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("inference", "0014_spend_call_cache_write_tokens")]

    operations = [
        migrations.AddField(
            model_name="inferencecall",
            name="paced_ms",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
