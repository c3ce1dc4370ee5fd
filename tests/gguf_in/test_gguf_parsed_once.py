"""A GGUF file is parsed once from the command line's check to the loaded model, and ``weights`` resolved once
(kestrel_trio.model.checked): the check's result goes on to the draft's vocabulary check and the load."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

from kestrel_trio import KestrelError, load_model
from kestrel_trio.model import checked as checked_module
from kestrel_trio.model import loading as model_loading
from kestrel_trio._model.gguf.reader import GgufFile
from kestrel_trio.cli import dispatch
from kestrel_trio.model import CheckedModel, check_model
from kestrel_trio.server import serve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GGUF = FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"  # a tokenizer in its metadata
FOLDER = FIXTURES / "qwen3_bf16_tied"


@pytest.fixture
def parses(monkeypatch) -> list[Path]:
    """The path of every GGUF file parsed (a GgufFile built) while the test runs, in order."""
    seen: list[Path] = []
    real = GgufFile.__init__

    def counting(self, path):
        seen.append(Path(path))
        real(self, path)
    monkeypatch.setattr(GgufFile, "__init__", counting)
    return seen


@pytest.fixture
def resolutions(monkeypatch) -> list[str]:
    """The ``weights`` of every residency resolution (the check's and the load's) while the test runs."""
    seen: list[str] = []
    for module in (checked_module, model_loading):
        def counting(folder, requested, *args, _real=module.resolve_residency, **kwargs):
            seen.append(requested)
            return _real(folder, requested, *args, **kwargs)
        monkeypatch.setattr(module, "resolve_residency", counting)
    return seen


def test_generate_parses_the_file_once_from_the_check_to_the_answer(parses, resolutions, capsys):
    code = dispatch.main(["--log-level", "WARNING", "generate", "hi", "--model", str(GGUF), "--max-tokens", "2",
                          "--temperature", "0"])
    assert code == 0, capsys.readouterr().err
    assert parses == [GGUF]
    assert resolutions == ["auto"]


async def _serve_until_ready(model, **options) -> str:
    """``serve(model, port=0, **options)`` until it is ready; the served model's weights_mode."""
    async with trio.open_nursery() as nursery:
        with trio.fail_after(120):  # a cold numba cache compiles the first products
            server = await nursery.start(functools.partial(serve, model, host="127.0.0.1", port=0, **options))
        mode = server.engine.model.weights_mode
        nursery.cancel_scope.cancel()
    return mode


async def test_serve_from_the_command_line_parses_the_model_and_its_draft_once_each(parses, resolutions,
                                                                                     monkeypatch):
    handed = []
    monkeypatch.setattr(dispatch, "serve_command", lambda args, model, draft: handed.append((args, model, draft)) or 0)
    assert dispatch.main(["--log-level", "WARNING", "serve", "--model", str(GGUF), "--draft-model", str(GGUF)]) == 0
    [(args, model, draft)] = handed
    assert isinstance(model, CheckedModel) and isinstance(draft, CheckedModel)
    assert parses == [GGUF, GGUF]  # the model's check, then the draft's
    assert await _serve_until_ready(model, draft_model=draft, weights=args.weights) == "gguf"
    assert parses == [GGUF, GGUF]  # nothing parsed again: not for the vocabularies, not for the loads
    assert resolutions == ["auto", "auto"]


async def test_serve_given_a_path_parses_it_once(parses, resolutions):
    assert await _serve_until_ready(GGUF) == "gguf"
    assert parses == [GGUF]
    assert resolutions == ["auto"]


@pytest.mark.parametrize(("weights", "mode"), [("auto", None), ("fp32", "fp32"), ("bf16", "bf16")])
def test_a_checked_folder_resolves_its_weights_once(resolutions, weights, mode):
    checked = check_model(FOLDER, weights=weights)
    loaded = load_model(checked, weights=weights)
    assert resolutions == [weights]  # a folder's auto is chosen at load, from the memory available then
    if mode is not None:
        assert loaded.weights_mode == mode


def test_a_model_checked_for_other_weights_is_refused_at_load_and_by_serve():
    checked = check_model(GGUF, weights="gguf")
    message = f"{GGUF}: checked for weights=gguf but loaded with weights=fp32"
    with pytest.raises(KestrelError, match="checked for weights=gguf but loaded with weights=fp32") as refused:
        load_model(checked, weights="fp32")
    assert refused.value.message.startswith(message)
    with pytest.raises(KestrelError) as refused:
        trio.run(functools.partial(serve, checked, port=0, weights="fp32"))
    assert refused.value.message.startswith(message)
