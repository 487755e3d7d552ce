"""The admin, one module per floor it shows (Django imports ``<app>.admin`` of each installed app;
this app's registers every model's page)."""

from . import agents, core, turns, waits, webhooks  # noqa: F401  (each registers its pages)
