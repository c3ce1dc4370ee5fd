"""``serve()`` start-up: a wrong model folder fails before the port is bound; a bind failure names the address."""

from __future__ import annotations

import errno
import functools
import logging
import socket
import sys
from pathlib import Path

import pytest
import trio

from kestrel_trio import EngineLimits, KestrelError, serve
from kestrel_trio.errors import ModelLoadError

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup


@pytest.mark.parametrize("make", ["missing", "no config.json", "broken config.json"])
async def test_a_bad_model_folder_fails_before_anything_listens(tmp_path, caplog, make):
    folder = tmp_path / "model"
    if make != "missing":
        folder.mkdir()
    if make == "broken config.json":
        (folder / "config.json").write_text("{", encoding="utf-8")
    caplog.set_level(logging.INFO)
    with trio.fail_after(10):
        with pytest.raises(ModelLoadError) as refused:  # raised as itself: nothing had started to wrap it
            await serve(folder, port=0)
    assert str(folder) in refused.value.message
    assert not any("listening" in record.getMessage() for record in caplog.records)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(("model", "context"), [
    (FIXTURES / "qwen3_bf16_tied", 512), (FIXTURES / "gguf" / "llama_quant" / "llama_quant.gguf", None), (None, 8192),
])
async def test_a_context_cap_beyond_the_config_fails_before_anything_listens_or_loads(caplog, monkeypatch, model,
                                                                                        context):
    def never(*args, **kwargs):
        raise AssertionError("serve loaded weights for a cap the config alone refuses")

    monkeypatch.setattr("kestrel_trio.server.load_model", never)
    monkeypatch.setattr("kestrel_trio.server.load_demo_model", never)
    caplog.set_level(logging.INFO)
    with trio.fail_after(10):
        with pytest.raises(KestrelError) as refused:  # raised as itself: nothing had started to wrap it
            await serve(model, port=0, engine_limits=EngineLimits(max_model_len=100_000))
    assert "max_model_len 100000 exceeds the model's context length of " in refused.value.message
    if context is not None:
        assert f"context length of {context} tokens" in refused.value.message
    assert not any("listening" in record.getMessage() for record in caplog.records)


async def test_a_port_in_use_is_an_oserror_naming_the_address():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with trio.fail_after(10):
            with pytest.raises(BaseExceptionGroup) as failed:
                await serve(None, port=port)
    (error,) = failed.value.exceptions
    assert isinstance(error, OSError) and error.errno == errno.EADDRINUSE
    assert error.strerror.startswith(f"cannot listen on 127.0.0.1:{port}: ")


async def test_what_start_up_made_is_out_of_the_collector_s_reach_once_the_server_is_ready(tiny_model):
    import gc

    made_at_start = object.__new__(type("MadeAtStart", (), {}))  # a tracked object that exists before ready
    gc.unfreeze()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                server = await nursery.start(functools.partial(serve, tiny_model, port=0))
                assert gc.get_freeze_count() > 0  # full collections no longer scan start-up's objects
                assert made_at_start not in gc.get_objects()  # frozen objects are not listed as tracked
                server.shutdown()
    finally:
        gc.unfreeze()
