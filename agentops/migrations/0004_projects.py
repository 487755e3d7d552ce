# Projects (tenancy): every token and agent belongs to one; existing rows go to "default".

import django.db.models.deletion
from django.db import migrations, models


def default_project(apps, schema_editor):
    Project = apps.get_model("agentops", "Project")
    project, _ = Project.objects.get_or_create(name="default")
    for model in ("Agent", "ApiToken"):
        apps.get_model("agentops", model).objects.filter(project__isnull=True).update(project=project)


class Migration(migrations.Migration):

    dependencies = [
        ('agentops', '0003_provider_kind_openai_responses'),
    ]

    operations = [
        migrations.CreateModel(
            name='Project',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.AddField(
            model_name='agent',
            name='project',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='agents', to='agentops.project'),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='project',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='tokens', to='agentops.project'),
        ),
        migrations.RunPython(default_project, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='agent',
            name='project',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='agents', to='agentops.project'),
        ),
        migrations.AlterField(
            model_name='apitoken',
            name='project',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='tokens', to='agentops.project'),
        ),
    ]
