"""Project-wide pytest policy: a skipped test is a failure (install the thing instead)."""

from __future__ import annotations

import pytest

# Shared test infrastructure: the local cluster harness (session cluster, per-test namespace
# and queues) and the loopback S3 API server (session server, per-test bucket).
pytest_plugins = ["e2e.cluster.pytest_plugin", "e2e.s3server", "e2e.operator_plugin"]


CLUSTER_GROUP = "shared-cluster"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs two workers, ``--dist loadgroup``) every test
    on the shared cluster runs on one worker, in order, against one cluster; the others
    (unit, torch, S3, the demo drills with clusters of their own) share out beside them."""
    for item in items:
        if "rtj_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == 0:
        reporter.write_line(
            f"FAILED: {len(skipped)} test(s) skipped; a skip means something is missing, "
            "and CI treats it as a failure.",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
