#!/usr/bin/env python
import os
import sys
from pathlib import Path

HOW = (
    "DATABASE_URL is not set and no embedded servers are running under var/.\n"
    "Start the service with `make run` (then run this again, or use `make token`), or run the\n"
    "command through the launcher, which starts what is missing:\n"
    "  .venv/bin/python -m devtools.launcher exec -- .venv/bin/python manage.py ...\n"
    "or set DATABASE_URL and REDIS_URL to your own servers."
)

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
    if not os.environ.get("DATABASE_URL"):
        # Never fall back silently to a default socket that may be another server's: use the
        # embedded servers `make run` started, or say how to run this.
        from devtools.embedded.running import running_urls

        found = running_urls(
            Path(os.environ.get("AGENTOPS_VAR_DIR") or Path(__file__).resolve().parent / "var")
        )
        if found is None:
            sys.exit(HOW)
        os.environ["DATABASE_URL"] = found["DATABASE_URL"]
        if not os.environ.get("REDIS_URL"):
            os.environ["REDIS_URL"] = found["REDIS_URL"]
        kept_key = (
            Path(__file__).resolve().parent / "var" / "secret-key"
        )  # the one `make run` keeps
        if not os.environ.get("DJANGO_SECRET_KEY") and kept_key.exists():
            os.environ["DJANGO_SECRET_KEY"] = kept_key.read_text().strip()
    import django
    from django.core.management import execute_from_command_line

    django.setup()
    # A command's process builds its runtime as the web and the worker build theirs: what it
    # writes may send live events, which go out through the runtime's loop; stopping it at the
    # end sends what is left.
    from agentops.runtime import serving
    from turns.runtime import TurnRuntime

    with serving(TurnRuntime(worker=False)):
        execute_from_command_line(sys.argv)
