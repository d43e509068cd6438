import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import tent  # noqa: E402
from helpers import CONFIG, Peer  # noqa: E402


@pytest.fixture
def engine():
    e = tent.TransferEngine(CONFIG)
    yield e
    e.close()


@pytest.fixture
def peer():
    """A second process with a 64 MiB patterned (seed 7) region."""
    p = Peer(64 << 20, 7)
    yield p
    p.close()


def pytest_report_header(config):
    return f"tent module: {tent.__file__}"
