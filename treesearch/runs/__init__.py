"""Test-set runs: the JSONL results file, the Ray driver, its worker actor and the cluster it joins."""
