"""Settings for the pytest process itself: no connection pool.

pytest-django creates, flushes and drops the test database around a pooled connection's back;
the test process runs one thread and needs no pool. Worker processes started by the tests use
``agentops.settings`` (with the pool), as in production.
"""

import os

from .settings import *  # noqa: F403
from .settings import DATABASES

DATABASES["default"]["OPTIONS"].pop("pool", None)

# The stand-in provider listens on loopback; worker processes the tests start read the
# environment (the launcher sets it too).
os.environ.setdefault("AGENTOPS_PROVIDERS_ALLOW_PRIVATE", "true")
AGENTOPS_PROVIDERS_ALLOW_PRIVATE = True
