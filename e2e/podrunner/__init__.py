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

Each pod gets an IP address of its own on loopback (``127.1.x.y``, unique among the pods of
every runner on the machine; the node is ``127.0.0.1``), reported as ``status.podIP`` and
given to the downward API, so pods sharing the host network can each listen on the same
port. Native sidecars (init containers with ``restartPolicy: Always``, Kubernetes >= 1.29)
follow the kubelet's rules (Kubernetes v1.35): started in their turn of the init sequence,
which moves on once they run; kept running beside the main containers and restarted (with a
back-off) if they exit; stopped once every main container has ended, without a say in the
pod's phase; stopped after the main containers when the pod is deleted. Under
``restartPolicy: OnFailure`` a main container that fails is restarted in its pod the same
way (``Never`` runs each once).

``spec`` turns a pod into the processes to run (pure); ``status`` renders the pod status a
kubelet would write (pure); ``podip`` hands out the pod addresses; ``pod`` runs one pod's
lifecycle (its processes and reports); ``runner`` is the rest of the I/O: nodes, the pod
watch.

    python -m e2e.podrunner --kubeconfig K --nodes 3 --root DIR

Where a real kubelet exists (kind), the runner is not used.
"""
