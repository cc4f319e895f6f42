"""``make demo``: the whole story in one command, with real training (see docs/demo.md)."""
