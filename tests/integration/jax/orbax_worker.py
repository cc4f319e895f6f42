"""A small JAX training loop with ``PublishingCheckpointer`` (Orbax), run as N processes
(CPU, gloo collectives, ``jax.distributed``) by test_orbax_integration.py.

    orbax_worker.py PROCESS PROCESSES PORT ROOT OUT_DIR

A linear model trained by SGD with momentum on a global batch every process contributes
rows to (drawn from the step and the process), 16 steps, saved every 4 (and at the end)
with ``keep_last=2``. ``KILL_AT=N``: after step N every process writes its pid into
``OUT_DIR/at-kill-<p>`` and sleeps, for the test to SIGKILL it. ``STOP_AFTER_RESTORE=1``:
report right after the restore (its parameters as the final ones) and train nothing. At
the end every process writes ``OUT_DIR/process-<p>.json`` (the step restored, the skipped
steps, each step's loss, the parameters at every save and at the end, as lists).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ["JAX_PLATFORMS"] = "cpu"

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

TOTAL, SAVE_EVERY, ROWS = 16, 4, 8


def main(process: int, processes: int, port: int, root: str, out: Path) -> int:
    if processes > 1:
        jax.distributed.initialize(
            f"127.0.0.1:{port}", num_processes=processes, process_id=process,
            cluster_detection_method="deactivate",
        )  # fmt: skip
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from rtj_shim.integrations.orbax import PublishingCheckpointer

    kill_at = int(os.environ.get("KILL_AT", "0"))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def everywhere(x: Any) -> Any:
        return jax.make_array_from_process_local_data(replicated, np.asarray(x))

    init = np.random.default_rng(0)
    state = {"w": everywhere(init.normal(size=(4, 1)).astype(np.float32)),
             "b": everywhere(np.zeros((1,), np.float32)),
             "mw": everywhere(np.zeros((4, 1), np.float32)),
             "mb": everywhere(np.zeros((1,), np.float32))}  # fmt: skip

    @jax.jit
    def train_step(s: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], Any]:
        def loss_fn(w: Any, b: Any) -> Any:
            return jnp.mean((x @ w + b - y) ** 2)

        loss, (gw, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1))(s["w"], s["b"])
        mw, mb = 0.9 * s["mw"] + gw, 0.9 * s["mb"] + gb
        return {"w": s["w"] - 0.05 * mw, "b": s["b"] - 0.05 * mb, "mw": mw, "mb": mb}, loss

    ckpt = PublishingCheckpointer(root, keep_last=2)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
    step, restored = ckpt.restore(abstract)
    if restored is not None:
        state = restored

    def params() -> dict[str, Any]:
        return {k: np.asarray(v.addressable_data(0)).tolist() for k, v in state.items()}

    losses: dict[int, float] = {}
    saved: dict[int, dict[str, Any]] = {}
    while step < TOTAL and not os.environ.get("STOP_AFTER_RESTORE"):
        step += 1
        g = np.random.default_rng(1000 * step + process)  # this step's rows from this process
        local_x = g.normal(size=(ROWS, 4)).astype(np.float32)
        local_y = np.sin(local_x.sum(axis=1, keepdims=True)).astype(np.float32)
        x = jax.make_array_from_process_local_data(rows, local_x)
        y = jax.make_array_from_process_local_data(rows, local_y)
        state, loss = train_step(state, x, y)
        losses[step] = float(np.asarray(loss.addressable_data(0)))
        if step % SAVE_EVERY == 0 or step == TOTAL:
            ckpt.save(step, state)
            saved[step] = params()
        if step == kill_at:
            (out / f"at-kill-{process}").write_text(str(os.getpid()))
            time.sleep(600)
    resumed = ckpt.resumed
    report = {
        "restored": 0 if resumed is None else resumed.step,
        "skipped": [] if resumed is None else [list(s) for s in resumed.skipped],
        "losses": losses,
        "params": params(),
        "saved": saved,
        "torch_imported": "torch" in sys.modules,
    }
    (out / f"process-{process}.json").write_text(json.dumps(report))
    if processes > 1:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    code = main(
        int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
