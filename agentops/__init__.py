"""agentops: runs LLM agents' model calls under progress bounds, durable waits and a breaker."""

from .celery import app as celery_app

__all__ = ["celery_app"]
