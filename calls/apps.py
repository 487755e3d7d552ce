from django.apps import AppConfig


class CallsConfig(AppConfig):
    """The provider floor: adapters, stream reading, bounds, classification, running a call."""

    name = "calls"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import config  # noqa: F401  (registers the bounds system check)
