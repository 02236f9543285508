"""`python -m treesearch ...` runs the command line (as the `treesearch` script does)."""

import sys

from treesearch.cli.main import main

sys.exit(main())
