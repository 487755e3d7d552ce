from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "agentops.webhooks"
    # The label stays "webhooks": permissions, task names and migrations keep their names.
    label = "webhooks"
    verbose_name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"
