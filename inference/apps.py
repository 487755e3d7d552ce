from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .calls import config  # noqa: F401  (registers the bounds system check)
