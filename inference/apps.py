from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """The models of turns, their calls and agents' leases (the app label the tables keep)."""

    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"
