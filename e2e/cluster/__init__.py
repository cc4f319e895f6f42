"""A real Kubernetes control plane on one machine, built from Go modules.

``python -m e2e.cluster up --nodes 8`` prints the kubeconfig path; see docs/cluster.md.
"""

from __future__ import annotations

from .cluster import LocalCluster
from .cluster_state import DEFAULT_NAME, ClusterState
from .processes import StartupError

__all__ = ["DEFAULT_NAME", "ClusterState", "LocalCluster", "StartupError"]
