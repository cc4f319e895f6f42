"""The checkpoint protocol: what a committed step is and how it is found, verified, kept and
pruned (layout, manifest, the commit protocol, verification, resume selection, retention,
lineage, the configuration guard) and the stores it is written to (``storage``).

Imports no other wing of the shim: the fast tier, the in-pod agent and the trainer's side
build on it (an import-linter contract keeps it so). No torch.
"""
