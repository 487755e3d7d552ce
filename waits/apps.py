from django.apps import AppConfig


class WaitsConfig(AppConfig):
    name = "waits"
    default_auto_field = "django.db.models.BigAutoField"
