"""`treesearch bench`: nokv, exact, rksc and transformers' continuous batching (hf-cb) side by side.

Modules: `workloads` (game24 BFS; `branch` and `fixed_tree` in their own modules, prompts in
`prompts`), `results` (what a run records), `modes` (what each mode switches on), `engines` (which
engine a run uses), `runner` (warm-up, repeats, same inputs and seeds for all), `hfcb` (generation
replay through `generate_batch`), `report` (JSON, markdown, plot), `paraphrase` (one question in k
wordings before a shared part: where ASKS can share), `claims` (the paper's claims as verdict rows),
`threads` (torch's OpenMP wait policy, default vs passive, on a quiet and a busy machine).
The command line lives in `treesearch.cli.bench`, `treesearch.cli.claims` (`bench claims`) and
`treesearch.calibrate.asks_fit` (`bench calibrate-asks`).
Entry point: `treesearch.cli.bench.main(argv) -> int`.
"""
