"""Images through the OpenAI API: the official client against the server on the tiny Qwen3-VL fixture.

The client is synchronous, so it runs in a worker thread while the server runs in the test's trio loop.
Answers are checked against transformers' greedy goldens (tests/fixtures/make_vl_fixtures.py).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import openai
import pytest
import trio

from kestrel_trio.model import Model, load_model
from kestrel_trio.app.media.images import ImagePolicy
from kestrel_trio.server import Server
from kestrel_trio.text import IncrementalDetokenizer

from server_kit import (
    assert_envelope, assert_left_in_decode_and_stopped, client_for, connected,
    event_count, fetch, greedy_tokens, running_server,
)

PIL_Image = pytest.importorskip("PIL.Image")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NEW_TOKENS = 16  # the goldens' greedy length
IMAGE_PAD = 511


@pytest.fixture(scope="module")
def text_model() -> Model:
    return load_model(FIXTURES / "qwen3_bf16_tied")


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def messages(*urls: str) -> list[dict]:
    """The fixture generator's prompt: text, the images, text."""
    parts = [{"type": "text", "text": "Look: "}, *map(image_part, urls),
             {"type": "text", "text": "What is the weather today?"}]
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": parts}]


def chat(server: Server, msgs: list[dict], *, stream: bool):
    """(answer text, finish_reason, usage) of a greedy chat completion through the official client."""
    with client_for(server) as client:
        response = client.chat.completions.create(
            model=server.state.model_id, messages=msgs, temperature=0, max_tokens=NEW_TOKENS, stream=stream,
            extra_body={"ignore_eos": True}, **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        if not stream:
            return response.choices[0].message.content, response.choices[0].finish_reason, response.usage
        chunks = list(response)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, finish[-1], chunks[-1].usage


def cut_text(model: Model, ids: list[int]) -> str:
    """The text of ``ids`` as a max_tokens cut sends it: a last character whose bytes never completed is dropped,
    not decoded as U+FFFD (the random golden answers end inside one)."""
    detokenizer = IncrementalDetokenizer(model.tokenizer)
    return "".join(detokenizer.push(token) for token in ids) + detokenizer.flush(cut=True)


@pytest.mark.parametrize("names", [("up",), ("up", "tall")], ids=["one_image", "two_images"])
async def test_a_base64_png_streams_the_greedy_golden_answer(vl_model: Model, golden, names) -> None:
    key = "image" if len(names) == 1 else "two_images"
    urls = [data_url(bytes(golden[f"image_bytes_{n}"])) for n in names]
    expected = cut_text(vl_model, golden[f"{key}_greedy_ids"].tolist())
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            streamed = await trio.to_thread.run_sync(lambda: chat(server, messages(*urls), stream=True))
            whole = await trio.to_thread.run_sync(lambda: chat(server, messages(*urls), stream=False))

    text, finish, usage = streamed
    assert text == expected and finish == "length"
    assert usage.prompt_tokens == golden[f"{key}_input_ids"].size  # counted after the pad runs are expanded
    assert usage.completion_tokens == NEW_TOKENS
    assert whole[0] == text and whole[1] == finish and whole[2].prompt_tokens == usage.prompt_tokens


async def test_a_text_only_request_on_the_vl_model_is_the_qwen3_path(vl_model: Model, golden) -> None:
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Look: What is the weather today?"}]
    prompt_ids = golden["text_input_ids"].tolist()
    assert vl_model.encode(vl_model.apply_chat_template(msgs)) == prompt_ids
    qwen3_path = greedy_tokens(vl_model, prompt_ids, NEW_TOKENS)  # plain Model.prefill / Model.step
    assert qwen3_path == golden["text_greedy_ids"].tolist()
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            text, finish, usage = await trio.to_thread.run_sync(lambda: chat(server, msgs, stream=True))
    assert text == vl_model.decode(qwen3_path) and finish == "length"
    assert usage.prompt_tokens == len(prompt_ids)


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    PIL_Image.new("RGB", (width, height), (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


async def _refusals(server: Server, cases: dict[str, tuple[list[dict], str, str]]) -> None:
    steps = server.engine.metrics.steps
    before = steps.value()
    for name, (msgs, param, fragment) in cases.items():
        response = await fetch(server.port, "POST", "/v1/chat/completions",
                               {"model": server.state.model_id, "messages": msgs, "max_tokens": 2})
        error = assert_envelope(response, 400)
        assert (error["param"], name) == (param, name)
        assert fragment in error["message"], (name, error["message"])
    assert steps.value() == before  # every refusal came before any engine work
    assert server.engine.queued == server.engine.active == 0


async def test_bad_images_get_a_400_naming_the_part_and_no_engine_step(vl_model: Model, tmp_path: Path) -> None:
    png = _png(48, 40)
    first = "messages[1].content[1].image_url"
    outside = tmp_path / "outside.png"
    outside.write_bytes(png)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "escape.png").symlink_to(outside)
    cases = {
        "remote": (messages("https://example.com/cat.png"), first, "not fetched"),
        "http": (messages("http://127.0.0.1:1/x.png"), first, "not fetched"),
        "corrupt": (messages(data_url(png[:-30])), first, "corrupt"),
        "not an image": (messages(data_url(b"hello, world" * 5)), first, "not a supported image"),
        "bad base64": (messages("data:image/png;base64,iVBOR*w0KGgo="), first, "base64"),
        "not base64": (messages("data:image/png,rawbytes"), first, "base64"),
        "malformed": (messages("data:image/png;base64"), first, "malformed"),
        "not an image type": (messages(data_url(png, "text/plain")), first, "image/"),
        "over bytes": (messages(data_url(png + b"\0" * 2000)), first, "limit"),
        "over pixels": (messages(data_url(_png(64, 64))), first, "limit is 3000 pixels"),
        "too many": (messages(*[data_url(png)] * 3), "messages[1].content[3].image_url", "at most 2 images"),
        "symlink out": (messages((allowed / "escape.png").as_uri()), first, "outside"),
        "outside": (messages(outside.as_uri()), first, "outside"),
        "dot-dot": (messages(f"file://{allowed}/../outside.png"), first, "outside"),
        "missing file": (messages((allowed / "nope.png").as_uri()), first, "no such image file"),
    }
    policy = ImagePolicy(max_bytes=len(png) + 100, max_pixels=3000, max_images=2)
    with trio.fail_after(60):
        async with running_server(vl_model, image_policy=policy, allow_image_dir=allowed) as server:
            await _refusals(server, cases)


async def test_file_urls_are_refused_unless_a_folder_is_allowed(vl_model: Model, golden, tmp_path: Path) -> None:
    image = tmp_path / "up.png"
    image.write_bytes(bytes(golden["image_bytes_up"]))
    expected = cut_text(vl_model, golden["image_greedy_ids"].tolist())
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            await _refusals(server, {"no folder": (messages(image.as_uri()), "messages[1].content[1].image_url",
                                                   "--allow-image-dir")})
        async with running_server(vl_model, allow_image_dir=tmp_path) as server:
            text, _, _ = await trio.to_thread.run_sync(lambda: chat(server, messages(image.as_uri()), stream=False))
    assert text == expected


async def test_images_sent_to_a_text_only_model_are_refused(text_model: Model, golden) -> None:
    url = data_url(bytes(golden["image_bytes_up"]))
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image_part(url)]}]
    with trio.fail_after(60):
        async with running_server(text_model) as server:
            await _refusals(server, {"text model": (msgs, "messages[0].content[1].image_url",
                                                    "does not accept images")})


async def test_the_openai_client_sees_the_refusal_as_a_bad_request(vl_model: Model) -> None:
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            def run():
                with pytest.raises(openai.BadRequestError) as caught:
                    chat(server, messages("https://example.com/cat.png"), stream=True)
                return caught.value

            error = await trio.to_thread.run_sync(run)
    assert error.status_code == 400
    assert error.body["param"] == "messages[1].content[1].image_url"


async def test_the_context_length_counts_the_expanded_image_tokens(vl_model: Model, golden) -> None:
    msgs = messages(data_url(bytes(golden["image_bytes_up"])))
    collapsed = len(vl_model.encode(vl_model.apply_chat_template(msgs)))  # one <|image_pad|> for the image
    expanded = golden["image_input_ids"].size
    assert expanded > collapsed
    max_tokens = vl_model.context_length - collapsed - 1  # would fit were the image one token
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            response = await fetch(server.port, "POST", "/v1/chat/completions",
                                   {"messages": msgs, "max_tokens": max_tokens})
            assert server.engine.metrics.steps.value() == 0
    error = assert_envelope(response, 400)
    assert error["code"] == "context_length_exceeded" and str(expanded) in error["message"]


async def test_a_vl_server_takes_bodies_big_enough_for_its_image_limit(vl_model: Model, text_model: Model) -> None:
    junk = bytes(range(256)) * (3 * 2**20 // 256)  # 3 MiB: over 4 MiB as base64, the default body limit
    body = {"messages": messages(data_url(junk)), "max_tokens": 2}
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            vl = await fetch(server.port, "POST", "/v1/chat/completions", body)
        async with running_server(text_model) as server:
            text = await fetch(server.port, "POST", "/v1/chat/completions", body)
    assert "not a supported image" in assert_envelope(vl, 400)["message"]  # read whole, refused as an image
    assert text.status == 413


async def test_an_image_stream_whose_client_leaves_stops_within_one_step(vl_model: Model, golden) -> None:
    msgs = messages(data_url(bytes(golden["image_bytes_up"])))
    body = {"messages": msgs, "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
    with trio.fail_after(60):
        async with running_server(vl_model) as server:
            engine = server.engine
            async with connected(server.port) as client:
                await client.send_request("POST", "/v1/chat/completions", json.dumps(body).encode())
                assert (await client.read_head()).status_code == 200
                await client.read_body(enough=lambda seen: event_count(seen) >= 4)
            await assert_left_in_decode_and_stopped(engine)
            assert engine.metrics.steps.value() < 900


def test_serve_flags_build_the_image_policy() -> None:
    from kestrel_trio.cli.parser import build_parser

    args = build_parser().parse_args(["serve", "--max-image-bytes", "1000", "--max-image-pixels", "2000",
                                      "--max-images", "0", "--allow-image-dir", str(FIXTURES)])
    assert (args.max_image_bytes, args.max_image_pixels, args.max_images) == (1000, 2000, 0)
    assert args.allow_image_dir == str(FIXTURES)
    defaults = build_parser().parse_args(["serve"])
    assert ImagePolicy(max_bytes=defaults.max_image_bytes, max_pixels=defaults.max_image_pixels,
                       max_images=defaults.max_images) == ImagePolicy()
    assert defaults.allow_image_dir is None
