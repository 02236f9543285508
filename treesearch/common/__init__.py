"""Leaves every layer may use: errors, configuration, counters, seeds, atomic files. Imports nothing above."""
