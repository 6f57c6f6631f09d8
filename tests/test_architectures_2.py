"""The other half of the family checks of tests/test_architectures.py (every other family,
``arch_zoo.family_cases(1)``): the same checks, in a file of their own so that test.sh's
one-file-per-process scheduling runs the two halves on two cores."""

import pytest

from tests.helpers import arch_zoo


@pytest.mark.parametrize("name, spec", arch_zoo.family_cases(1))
def test_family(name, spec):
    arch_zoo.family_test(name, spec)
