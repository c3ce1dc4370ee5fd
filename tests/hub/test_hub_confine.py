"""Issue 49 item 6 on pull: a hostile mirror's index may not name a shard outside the snapshot, which would be
written (as a link) and read outside it; refused with one ModelLoadError naming the index and the shard."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hub_server import FakeHub

from kestrel_trio import ModelLoadError
from kestrel_trio.hub import HubSettings, resolve_model

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"


@pytest.mark.parametrize("shard", ["../../evil.safetensors", "../other/model.safetensors", "/tmp/evil.safetensors"])
def test_an_index_naming_a_shard_outside_the_snapshot_is_refused(fake_hub: FakeHub, hub_settings: HubSettings,
                                                                 shard: str):
    index = json.dumps({"weight_map": {"model.embed_tokens.weight": shard}}).encode()
    files = {"config.json": (TINY / "config.json").read_bytes(), "model.safetensors.index.json": index,
             shard: b"\0" * 64}
    fake_hub.add_repo("Evil/Shards", files)
    with pytest.raises(ModelLoadError) as refused:
        resolve_model("Evil/Shards", hub=hub_settings, stream=io.StringIO())
    message = refused.value.message
    assert "model.safetensors.index.json" in message and shard in message and "\n" not in message
    assert not (Path(hub_settings.cache_dir) / "evil.safetensors").exists()
