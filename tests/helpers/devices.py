"""Where the tests run: the CPU, or the device ``SPECDEC_TEST_DEVICE`` names (``cuda``), which
tests/conftest.py makes torch's default (docs/results.md, "On a GPU")."""

import contextlib
import os

import pytest
import torch

TEST_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
ON_CPU = torch.device(TEST_DEVICE).type == "cpu"


@contextlib.contextmanager
def process_cores():
    """Run torch on this process's share of the cores (:func:`cores_of_this_process`) inside,
    and on one thread again after (tests/conftest.py's setting)."""
    torch.set_num_threads(cores_of_this_process())
    try:
        yield
    finally:
        torch.set_num_threads(1)


def cores_of_this_process() -> int:
    """This test process's share of the cores: all of them under plain pytest, the cores over the
    number of xdist processes under ``test.sh`` (at least one). Two threads beside a busy second
    process made the real-model tests 2.5 times slower than one thread on 2 cores."""
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, (os.cpu_count() or 1) // max(1, processes))


def seeded_on_cpu(make, seed: int):
    """``make()`` after ``torch.manual_seed(seed)``, built on the CPU and moved to the test device:
    the same weights on every device (a CUDA generator draws other numbers from the same seed, and
    a test's data, the drafts it accepts and rejects, would change with them)."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = make()
    return model.to(torch.get_default_device())


def int8_route_missing() -> str:
    """Why ``self:int8`` cannot run on the test device, in one line ("" when it can): off a CPU its
    route is optimum-quanto (``model_drafters.selfdraft.copies.default_int8_method``), a package a
    lent GPU machine may not have."""
    from model_drafters.selfdraft.copies import default_int8_method, int8_available

    method = default_int8_method(torch.device(TEST_DEVICE))
    if int8_available(method):
        return ""
    package = {"quanto": "optimum-quanto"}.get(method, method)
    return f"{package} is not installed: self:int8 on {TEST_DEVICE} needs it"


INT8_MISSING = int8_route_missing()
# A test of self:int8 where its route's package is missing is skipped, with that one line.
needs_int8 = pytest.mark.skipif(bool(INT8_MISSING), reason=INT8_MISSING or "self:int8 runs here")
