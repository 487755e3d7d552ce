"""Stand-in provider: a real HTTP server imitating the OpenAI and Anthropic APIs (chat
completions, Responses, Messages), streamed and not, for the tests, the benches and the demo.
``python -m devtools.standin --port 0``; its scenarios, control endpoints and wire details are
in docs/standin.md."""

from __future__ import annotations

from devtools.standin.app import StandinApp, create_app
from devtools.standin.listening import LISTENING_PREFIX

__all__ = ["LISTENING_PREFIX", "StandinApp", "create_app"]
