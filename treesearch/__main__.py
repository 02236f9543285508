"""`python -m treesearch ...` runs the command line (as the `treesearch` script does)."""

from treesearch.cli.main import main

raise SystemExit(main())
