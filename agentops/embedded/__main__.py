"""``python -m agentops.embedded up|down VAR_DIR`` (see ``cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
