"""`treesearch bench`: nokv, exact, rksc and transformers' continuous batching (hf-cb) side by side.

Modules: `workloads` (game24 BFS; `branch` and `tree` in their own modules, prompts in `prompts`),
`results` (what a run records), `modes` (what each mode switches on), `runner` (warm-up, repeats,
same inputs and seeds for all),
`hfcb` (generation replay through `generate_batch`), `report` (JSON, markdown, plot), `cli`.
Entry point: `treesearch.bench.cli.main(argv) -> int`.
"""
