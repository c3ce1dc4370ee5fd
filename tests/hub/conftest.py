"""Fixtures of the hub suite: a stand-in hub on 127.0.0.1 and settings that point at it with an empty cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_server import FakeHub

from kestrel_trio.hub import HubSettings


@pytest.fixture
def fake_hub():
    with FakeHub() as hub:
        yield hub


@pytest.fixture
def hub_settings(fake_hub: FakeHub, tmp_path: Path) -> HubSettings:
    """The stand-in hub, an empty cache in tmp_path, no token, online."""
    return HubSettings(endpoint=fake_hub.url, cache_dir=tmp_path / "hf" / "hub", token=None, offline=False)
