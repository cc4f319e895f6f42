"""Project-wide pytest policy: a skipped test is a failure (install the thing instead)."""

from __future__ import annotations

import os

import pytest

# every plan, here and in the operators the tests start, is held to the recovery table
os.environ["RTJ_STRICT_RECOVERY_TABLE"] = "1"

# Shared test infrastructure: the local cluster harness (session cluster, per-test namespace
# and queues) and the loopback S3 API server (session server, per-test bucket).
pytest_plugins = ["e2e.cluster.pytest_plugin", "e2e.s3server", "e2e.operator_plugin"]


CLUSTER_GROUP = "shared-cluster"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs two workers, ``--dist loadgroup``) every test
    on the shared cluster runs on one worker, in order, against one cluster; the others
    (unit, torch, S3, the demo drills with clusters of their own) share out beside them.
    First among the hooks: a worker's xdist hook, registered after this conftest and so
    called before it, reads the groups to name the tests (``<id>@shared-cluster``); marked
    after it, every test ran ungrouped, two workers each started the shared cluster and the
    real node, and the real-node tests failed (stop 50)."""
    for item in items:
        if "rtj_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))
    items.sort(key=_queue_position)


def _queue_position(item: pytest.Item) -> int:
    """Longest work first, so that no drill of minutes starts last while the other worker
    idles (xdist hands out work in collection order, where e2e/ came after tests/): the
    shared cluster's group (one unit of many minutes), then the demo drills and the slow
    tests, then the rest in their order (the sort is stable)."""
    if "rtj_cluster" in getattr(item, "fixturenames", ()):
        return 0
    if item.get_closest_marker("demo") or item.get_closest_marker("slow"):
        return 1
    return 2


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a worker of ``--dist loadgroup``, a test marked for a group must have been named
    for it, or the groups split over the workers silently (as with pytest 9.2: two workers
    each started the shared cluster and the real node): it fails, saying so."""
    config = item.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
        pytest.fail(
            "--dist loadgroup did not take: this pytest and pytest-xdist do not group "
            "tests (see the pin in pyproject.toml)",
            pytrace=False,
        )


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
