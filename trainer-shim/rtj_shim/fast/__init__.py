"""The fast checkpoint tier: each rank's copy of a step in pod-local memory, its peer replica
in another pod, and the drain that publishes fast steps as durable ones. Builds on the
checkpoint protocol and the wire formats; never on the in-pod agent.
"""
