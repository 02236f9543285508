"""The search: `Searcher` (its expansion, evaluation, resume and answer pieces in modules of their
own), `solve_many`, the verifier, context limits, results, why a search stopped, and result files.

Imports strategies, core, backends and (lazily, where one is built) the local engine."""
