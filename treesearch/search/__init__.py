"""The search: `Searcher`, `solve_many`, the verifier, context limits, results and their files.

Imports strategies, core, backends and (lazily, where one is built) the local engine."""
