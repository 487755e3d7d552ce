"""What a start returns: the ``EmbeddedService`` handle, its error, and the shared constants."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 60.0


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be started (the message says what, and where the log is)."""


@dataclass
class EmbeddedService:
    """A running embedded server. ``stop()`` shuts it down cleanly and is idempotent."""

    name: str  # "postgres" | "redis"
    url: str  # postgres://postgres@127.0.0.1:PORT/agentops | redis://127.0.0.1:PORT/0
    port: int = 0
    pid: int | None = None
    log_path: Path | None = None
    reused: bool = False  # an already running server from this var dir was adopted
    owned: bool = True  # False: adopted from a live process that started it; stop() leaves it
    _stopper: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    _probe: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def stop(self) -> None:
        """Stop the server (fast shutdown for PostgreSQL, SIGTERM for Redis); idempotent.

        For a server that is not ``owned`` this only detaches from it.
        """
        with self._lock:
            stopper, self._stopper = self._stopper, None
        if stopper is not None:
            stopper()

    def is_running(self) -> bool:
        """True while the server process is alive (and ``stop()`` has not been called)."""
        return self._stopper is not None and self._probe is not None and self._probe()

    def __enter__(self) -> EmbeddedService:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
