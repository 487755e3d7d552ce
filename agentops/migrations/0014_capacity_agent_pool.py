from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agentops", "0013_project_granted_providers")]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="pool",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
