from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("inference", "0015_spend_call_input_estimate")]

    operations = [
        migrations.AddField(
            model_name="inferencecall",
            name="paced_ms",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
