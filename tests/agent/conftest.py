"""Fixtures for the agent's tests.

``nvml_module`` runs a test against the pynvml stand-in and, on a machine
where real NVML initialises, against the real library too: the "real" variant
is only collected there, so nothing is skipped anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from tests.agent.fake_pynvml import h100_node


def real_nvml_available() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


REAL_NVML = real_nvml_available()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nvml_module" in metafunc.fixturenames:
        variants = ["stand-in", "real"] if REAL_NVML else ["stand-in"]
        metafunc.parametrize("nvml_module", variants, indirect=True)


@pytest.fixture
def nvml_module(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The pynvml stand-in (a healthy 8x H100 node), or the real pynvml."""
    if request.param == "real":
        yield pynvml
    else:
        yield h100_node()
