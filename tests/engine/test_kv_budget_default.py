"""The default KV budget: what the machine, the cgroup and the address-space limit leave, read from files."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import trio

import kestrel_trio.engine.memory.kv_budget as kv_budget_module
from kestrel_trio.engine import EngineLimits
from kestrel_trio.engine.memory.host_memory import HostMemory, read_host_memory
from kestrel_trio.engine.memory.kv_budget import (
    BUDGET_SHARE, HEADROOM_BYTES, derive_budget_bytes, step_temporaries_bytes,
)
from kestrel_trio._model.weights.resident import is_mapped, mapped_bytes
from kestrel_trio._model.weights.residency import _matrices as weight_matrices
from kestrel_trio.errors import KestrelError
from kestrel_trio.model import Model, load_model

from engine_kit import running_engine

GIB = 2**30
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"


def fake_proc(tmp_path: Path, *, available_kib: int, cgroup: str = "0::/app.slice/kestrel.service") -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 33554432 kB\nMemFree: 1000 kB\nMemAvailable: {available_kib} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup + "\n")
    (proc / "self" / "status").write_text("VmSize: 1048576 kB\n")
    return proc


def test_mem_available_alone_when_there_is_no_cgroup_limit(tmp_path):
    proc = fake_proc(tmp_path, available_kib=8 * 2**20)
    root = tmp_path / "cgroup"
    (root / "app.slice" / "kestrel.service").mkdir(parents=True)
    (root / "app.slice" / "kestrel.service" / "memory.max").write_text("max\n")
    host = read_host_memory(proc, root)
    assert host.mem_available == 8 * GIB and host.cgroup_room is None
    assert host.available == 8 * GIB


def test_the_cgroup_limit_of_this_process_wins_when_it_is_smaller(tmp_path):
    proc = fake_proc(tmp_path, available_kib=8 * 2**20)
    service = tmp_path / "cgroup" / "app.slice" / "kestrel.service"
    service.mkdir(parents=True)
    (service / "memory.max").write_text(str(3 * GIB))
    (service / "memory.current").write_text(str(1 * GIB))
    host = read_host_memory(proc, tmp_path / "cgroup")
    assert host.cgroup_room == 2 * GIB and host.available == 2 * GIB
    assert "cgroup room 2.00 GiB" in host.describe()


def test_a_container_sees_its_own_cgroup_at_the_root(tmp_path):
    proc = fake_proc(tmp_path, available_kib=8 * 2**20, cgroup="0::/")
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(str(4 * GIB))
    (root / "memory.current").write_text(str(GIB))
    assert read_host_memory(proc, root).cgroup_room == 3 * GIB


def test_an_address_space_limit_counts_from_the_processs_size(tmp_path, monkeypatch):
    proc = fake_proc(tmp_path, available_kib=8 * 2**20)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (3 * GIB, resource.RLIM_INFINITY))
    host = read_host_memory(proc, tmp_path / "no-cgroup")
    assert host.address_space_room == 2 * GIB  # 3 GiB limit - 1 GiB VmSize
    assert host.available == 2 * GIB


def test_the_budget_takes_off_mapped_weights_headroom_and_step_temporaries():
    host = HostMemory(mem_available=10 * GIB, cgroup_room=6 * GIB)
    budget, how = derive_budget_bytes(host, mapped_weight_bytes=GIB, step_bytes=GIB // 2)
    assert budget == int((6 * GIB - GIB - HEADROOM_BYTES - GIB // 2) * BUDGET_SHARE)
    assert "cgroup room 6.00 GiB" in how and "1024.0 MiB of mapped weights" in how


def test_too_little_memory_left_is_an_error_that_says_what_to_set():
    with pytest.raises(KestrelError, match="--kv-cache-mb"):
        derive_budget_bytes(HostMemory(mem_available=260 * 2**20), mapped_weight_bytes=0, step_bytes=0)
    with pytest.raises(KestrelError, match="cannot read how much memory"):
        derive_budget_bytes(HostMemory(mem_available=None), mapped_weight_bytes=0, step_bytes=0)


def test_step_temporaries_grow_with_the_context_cap():
    config = load_model(FIXTURE).config
    small = step_temporaries_bytes(config, prefill_chunk=256, max_batch=4, max_model_len=512)
    large = step_temporaries_bytes(config, prefill_chunk=256, max_batch=4, max_model_len=40960)
    scores = config.num_attention_heads * 256 * (40960 - 512) * 4
    assert large - small >= scores


def test_only_weights_mapped_from_the_checkpoint_count_as_mapped(demo_model: Model):
    bf16 = load_model(FIXTURE, weights="bf16")  # bf16 storage, mapped as is
    upcast = load_model(FIXTURE, weights="fp32")  # bf16 storage read into float32 copies
    fp32_folder = FIXTURE.parent / "qwen3_fp32"
    fp32 = load_model(fp32_folder, weights="fp32")  # fp32 storage: streamed matrices read into arrays
    assert mapped_bytes(demo_model.decoder.weights) == mapped_bytes(upcast.decoder.weights) == 0
    assert 0 < mapped_bytes(bf16.decoder.weights) <= sum(f.stat().st_size for f in FIXTURE.glob("*.safetensors"))
    weights = fp32.decoder.weights
    assert not fp32.config.tie_word_embeddings and is_mapped(weights.embed_tokens)  # looked up by row only
    streamed = [m for m in weight_matrices(weights) if m is not weights.embed_tokens]
    assert streamed and not any(is_mapped(m) for m in streamed)  # huge pages, not the page cache's (weights.py)
    assert mapped_bytes(weights) < weights.embed_tokens.nbytes + 4096  # the embedding and the vectors


async def test_an_engine_without_a_set_budget_derives_one_from_this_machine(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model) as engine:
            report = engine.memory_report()
    assert engine.kv.budget_bytes > 0 and engine.kv.source.startswith("derived at start: MemAvailable")
    assert report["kv_cache"]["budget_from"] == engine.kv.source


def test_a_cgroup_v1_memory_limit_of_this_process_counts(tmp_path):
    proc = fake_proc(tmp_path, available_kib=8 * 2**20, cgroup="4:memory:/box/one\n0::/")
    folder = tmp_path / "cgroup" / "memory" / "box" / "one"
    folder.mkdir(parents=True)
    (folder / "memory.limit_in_bytes").write_text(str(5 * GIB))
    (folder / "memory.usage_in_bytes").write_text(str(GIB))
    (tmp_path / "cgroup" / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")
    assert read_host_memory(proc, tmp_path / "cgroup").cgroup_room == 4 * GIB
    folder.joinpath("memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert read_host_memory(proc, tmp_path / "cgroup").cgroup_room is None


def test_on_an_8_gb_board_the_default_budget_is_what_the_batch_and_the_prefix_cache_can_use(
    tiny_model: Model, monkeypatch
) -> None:
    # A board with 8 GiB, 6 GiB of it free at start: the KV budget is not most of it, but what max_batch
    # sequences at the context cap and the prefix cache can ever hold.
    board = HostMemory(mem_available=6 * GIB)
    monkeypatch.setattr(kv_budget_module, "read_host_memory", lambda: board)
    limits = EngineLimits()
    budget = kv_budget_module.budget_for(tiny_model, limits)
    per_sequence = 512 * tiny_model.decoder.kv_token_bytes("fp32")  # the 512-token context, in whole blocks
    assert budget.budget_bytes == limits.max_batch * per_sequence + limits.prefix_cache_bytes
    assert limits.prefix_cache_bytes <= 256 * 2**20  # a modest fixed share, not half a gigabyte
    assert "capped at" in budget.source and "MemAvailable 6.00 GiB" in budget.source
    wider = kv_budget_module.budget_for(tiny_model, EngineLimits(max_batch=8, prefix_cache_bytes=0))
    assert wider.budget_bytes == 8 * per_sequence
    drafted = kv_budget_module.budget_for(tiny_model, EngineLimits(max_batch=2, prefix_cache_bytes=0),
                                          draft_token_bytes=256)  # a draft model's cache beside each sequence's
    assert drafted.budget_bytes == 2 * (per_sequence + 512 * 256)


def test_a_model_that_could_use_more_gets_a_modest_share_of_what_is_free():
    board = HostMemory(mem_available=6 * GIB)  # an 8 GiB board shared with other programs
    budget, how = derive_budget_bytes(board, mapped_weight_bytes=GIB, step_bytes=GIB // 4,
                                      most_bytes=40 * GIB)  # e.g. 4 x 40,960 tokens of Qwen3-8B KV
    room = 6 * GIB - GIB - HEADROOM_BYTES - GIB // 4
    assert budget <= room // 2  # half at most, not 90%: the board runs other programs too
    assert budget == int(room * BUDGET_SHARE) and "capped" not in how
