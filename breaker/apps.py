from django.apps import AppConfig


class BreakerConfig(AppConfig):
    name = "breaker"
    default_auto_field = "django.db.models.BigAutoField"
