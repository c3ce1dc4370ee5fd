"""Fixtures of the HTTP layer tests."""

from __future__ import annotations

import pytest

from http_kit import RawClient


@pytest.fixture
async def close_raw_clients():
    """Close the raw clients a trio test left open (trio sockets close inside the run)."""
    yield
    RawClient.close_all()
