"""`make test` keeps every Ray test in one xdist group (tests/conftest.py): the group must
reach xdist's scheduler, or two Ray clusters run at once on two cores."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("ray")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    # In a worker, xdist keeps --dist's value as its `loadgroup` option.
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getoption("loadgroup"):
        pytest.skip("groups exist only in a run with --dist loadgroup, as make test runs")
    # xdist's loadgroup scheduler reads the group from this suffix of the test's id.
    assert request.node.nodeid.endswith("@ray"), request.node.nodeid
