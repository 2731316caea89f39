"""``python -m firesched``: the command line (``firesched --help``; the subcommands are in
``firesched.cli``), e.g. ``python -m firesched demo``."""

from __future__ import annotations

import sys

from firesched.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
