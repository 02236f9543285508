"""The K/V cache: the store (segments in a token tree, blocks, refs), the cache manager (what is
resident and why) and shared-prefix attention. Knows nothing of thoughts, searches or the engine."""
