from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"
