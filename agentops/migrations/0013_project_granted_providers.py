# Providers granted to projects: no project has a list yet (providers_granted_at null), so every
# existing project keeps every provider until an operator grants one.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentops', '0012_spend_budget_ledger'),
    ]

    operations = [
        migrations.AddField(
            model_name='project',
            name='granted_providers',
            field=models.ManyToManyField(blank=True, related_name='granted_to', to='agentops.provider'),
        ),
        migrations.AddField(
            model_name='project',
            name='providers_granted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
