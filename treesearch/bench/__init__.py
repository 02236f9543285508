"""`treesearch bench`: nokv, exact, rksc and transformers' continuous batching (hf-cb) side by side.

Modules: `workloads` (game24 BFS; `branch` and `tree` in their own modules, prompts in `prompts`),
`results` (what a run records), `modes` (what each mode switches on), `runner` (warm-up, repeats,
same inputs and seeds for all),
`hfcb` (generation replay through `generate_batch`), `report` (JSON, markdown, plot), `cli`;
`paraphrase` (one question in k wordings before a shared part: where ASKS can share), `asks_gate`
(the shipped ASKS gate and its fit), `calibrate_asks` (`bench calibrate-asks`), `claims` and
`claims_run` (`bench claims`: the paper's claims, one table), `commands` (the subcommands).
Entry point: `treesearch.cli.bench.main(argv) -> int`.
"""
