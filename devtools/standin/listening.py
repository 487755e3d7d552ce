"""The one stdout line of ``python -m devtools.standin``: it is listening.

Once its socket listens the server (:mod:`devtools.standin.__main__`) prints
``standin listening on http://HOST:PORT`` and flushes;
:class:`devtools.standin.process.StandinProcess` waits for that line and
takes the base URL after the prefix.
"""

LISTENING_PREFIX = "standin listening on "
