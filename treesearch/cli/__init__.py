"""The command line: `treesearch solve | run | bench | calibrate`, their shared flags, argument checks and
the one place argument errors become `treesearch: error: ...` (exit 2)."""
