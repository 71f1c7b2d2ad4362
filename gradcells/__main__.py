"""``python -m gradcells``: the command line (``gradcells.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
