"""End-to-end harness: the local cluster (e2e.cluster) and the scenarios that run against it."""
