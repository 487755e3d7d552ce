"""``python -m devtools.embedded up|down VAR_DIR`` (see ``cli``)."""

import sys

from devtools.embedded.cli import main

if __name__ == "__main__":
    sys.exit(main())
