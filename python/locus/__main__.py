"""`python -m locus` is the same as the `locus` command."""

import sys

from locus.cli import main

if __name__ == "__main__":
    sys.exit(main())
