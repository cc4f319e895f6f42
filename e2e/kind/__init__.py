"""The same cluster scenarios against a kind cluster (needs Docker; see docs/cluster.md)."""
