from django.apps import AppConfig


class InterfacesConfig(AppConfig):
    """The floor people and programs touch: the API, the drop-in endpoints, the admin, the
    dashboard and its sockets, the management commands and the Celery tasks."""

    name = "interfaces"
    default_auto_field = "django.db.models.BigAutoField"
