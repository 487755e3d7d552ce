"""The one stdout line of ``python -m inference.standin``: it is listening.

Once its socket listens the server (:mod:`inference.standin.__main__`) prints
``standin listening on http://HOST:PORT`` and flushes;
:class:`inference.standin.process.StandinProcess` waits for that line and
takes the base URL after the prefix.
"""

LISTENING_PREFIX = "standin listening on "
