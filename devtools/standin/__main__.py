"""``python -m devtools.standin [--host HOST] [--port PORT]``.

Serves the stand-in provider with uvicorn.  Once the socket is listening it
prints exactly one line to stdout, ``standin listening on http://HOST:PORT``
(``--port 0`` picks a free port; the line carries the real one), and flushes.
SIGINT/SIGTERM end open streams and exit with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from types import FrameType

import uvicorn

from devtools.standin.app import StandinApp
from devtools.standin.listening import LISTENING_PREFIX


def format_base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: StandinApp, base_url: str) -> None:
        super().__init__(config)
        self._app = app
        self._base_url = base_url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            print(f"{LISTENING_PREFIX}{self._base_url}", flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # Wake every waiting scenario (hang, silent, endless ...) so that the
        # graceful shutdown does not wait for clients that never leave.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._app.begin_shutdown()
        else:
            loop.call_soon_threadsafe(self._app.begin_shutdown)


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    return sock


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    # Installed outside uvicorn's own handlers: a signal before uvicorn starts
    # (or re-raised by uvicorn after its graceful shutdown) exits with 0.
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.standin",
        description="Stand-in OpenAI/Anthropic provider for tests and demos.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    args = parser.parse_args(argv)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)

    sock = _bind(args.host, args.port)
    port = sock.getsockname()[1]
    app = StandinApp()
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        access_log=False,  # uvicorn's access log goes to stdout; stdout is for the one line
        lifespan="on",
        timeout_graceful_shutdown=3,
        timeout_keep_alive=30,
    )
    server = _Server(config, app, format_base_url(args.host, port))
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
