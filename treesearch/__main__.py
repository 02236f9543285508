"""`python -m treesearch ...` runs the command line (as the `treesearch` script does)."""

from .cli import main

raise SystemExit(main())
