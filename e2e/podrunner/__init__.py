"""A local pod runner: a kubelet stand-in for demos and end-to-end tests (never part of the
operator).

Simulated (KWOK) nodes run no containers, so nothing would really train. The runner
registers a few nodes of its own (labelled ``e2e.resilient.dev/pod-runner=local``, GPU
capacity and labels like the KWOK nodes, a Lease heartbeat), and for every pod the scheduler
binds to one of them it runs the init containers and then the containers as local
processes with the pod's environment, and reports their lifecycle to the API server as a
kubelet would: Pending with init containers running, Running, then terminated with the real
exit code, reason, message and finishedAt. A deleted pod's processes get SIGTERM, then
SIGKILL after the grace period, and the pod is finalized. Killing a worker's process is then
a real fault, and the other ranks really fail.

``spec`` turns a pod into the processes to run (pure); ``status`` renders the pod status a
kubelet would write (pure); ``runner`` is the I/O: nodes, the pod watch, processes.

    python -m e2e.podrunner --kubeconfig K --nodes 3 --root DIR

Where a real kubelet exists (kind), the runner is not used.
"""
