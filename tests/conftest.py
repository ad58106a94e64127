"""Test-suite settings shared by every test module."""

import os

import pytest

# litellm fetches a model price list over the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Generated tasks mix in the user's task secret (mappa_env.tasks.secret). A fixed one,
# whatever the caller's environment holds, gives the suite the same tasks on every
# machine and never writes a secret file into the home of whoever runs the tests.
os.environ["MAPPA_TASK_SECRET"] = "mappa-test-suite"
# No test reaches the Hugging Face Hub: a benchmark name that no local folder holds fails
# at once instead of downloading its public dataset (tests use local stand-ins).
os.environ["HF_HUB_OFFLINE"] = "1"
# xdist workers share the machine's cores: each worker (and the Ray actors, kernels and
# trainers it starts) gets its share of OpenMP threads, so torch's thread pools in two
# workers do not fight over two cores (trainer tests ran a fifth faster that way here).
# Set before torch is imported; an OMP_NUM_THREADS of the caller's is kept.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))


# Tests that start a Ray cluster (its daemons and one actor process per learner rank and
# engine). Two at once on a 2-core machine starve each other and everything beside them:
# `make test` runs them in one xdist group (--dist loadgroup), one after another.
RAY_MODULES = {"test_ray_trainer", "test_ray_placement", "test_bench_distributed",
               "test_bench_multi_gpu"}  # fmt: skip


@pytest.fixture(scope="session")
def ray_cluster():
    """Start this process's local Ray cluster with ``gpus`` (fake) GPUs, or keep it.

    Starting Ray takes seconds of both cores (its daemons are Python processes of their
    own), so modules whose tests need the same cluster share one: the Ray tests run one
    after another in one worker. A cluster with other GPUs, or one that code under test
    shut down, is started again.
    """
    ray = pytest.importorskip("ray")
    running: dict[str, int] = {}

    def start(gpus: int = 0) -> None:
        if ray.is_initialized() and running.get("gpus") == gpus:
            return
        if ray.is_initialized():
            ray.shutdown()
        ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
        running["gpus"] = gpus

    yield start
    if ray.is_initialized():
        ray.shutdown()


def pytest_runtest_teardown(item, nextitem):
    """Stop the shared Ray cluster when the next test of this process needs none.

    Its idle daemons would otherwise take CPU from the tests after it, and a worker
    may run other tests between Ray tests.
    """
    if "ray_cluster" not in item.fixturenames:
        return
    if nextitem is not None and "ray_cluster" in nextitem.fixturenames:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """Put every test that starts Ray in the ``ray`` xdist group (where xdist is installed)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return  # one process: the tests run one after another anyway
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if module in RAY_MODULES or "[ray/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("ray"))
