"""Test-session settings shared by every test module."""

import pytest
import torch

from tests.helpers import devices
from tests.helpers.devices import ON_CPU, TEST_DEVICE
from tests.helpers.distribution import sharp_drafter, sharp_target

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine
# several threads per process spin against each other (30x slower seen here).
torch.set_num_threads(1)

# SPECDEC_TEST_DEVICE=cuda runs the tests on a GPU (docs/results.md, "On a GPU"): every tensor and
# model a test makes lands there (torch's default device), and so does a generator a test seeds
# without naming a device (a CUDA sampler draws from a CUDA generator only). The default is the CPU.
if not ON_CPU:
    torch.set_default_device(TEST_DEVICE)
    _Generator = torch.Generator

    class _AnyGenerator(type(_Generator)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, _Generator)

    class _DeviceGenerator(_Generator, metaclass=_AnyGenerator):
        def __new__(cls, device=None):
            return _Generator(device if device is not None else TEST_DEVICE)

    torch.Generator = _DeviceGenerator


@pytest.fixture
def process_cores():
    """Use this process's share of the cores (``devices.cores_of_this_process``) for a test with a
    real model, then go back to one thread."""
    with devices.process_cores():
        yield


@pytest.fixture(scope="module")
def target():
    """The sampling tests' tiny target over an 8-token vocabulary (tests/helpers/distribution.py);
    a module that needs another target defines its own ``target`` fixture, which takes precedence."""
    return sharp_target()


@pytest.fixture(scope="module")
def drafter():
    """The sampling tests' drafter, initialised independently of ``target``."""
    return sharp_drafter()
