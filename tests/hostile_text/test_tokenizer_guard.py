"""Issue 49 items 2 and 5: the Rust tokenizer cannot end the process, and its input is capped before the call.

A panic in ``tokenizers`` arrives as pyo3's PanicException, a BaseException that ``except Exception`` never
sees: it must become the one request's error. A text that cannot fit the context is refused from its length (or
after a few pieces), so ``/tokenize`` of megabytes neither builds millions of tokens nor raises the high-water mark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hostile_text_kit import backtracking_tokenizer, copy_fixture, run_child

from kestrel_trio.errors import KestrelError
from kestrel_trio.model import load_model
from kestrel_trio.text import Tokenizer
from server_kit import assert_envelope, fetch, running_server

PANIC_TEXT = "a" * 200 + "b"


def test_a_tokenizer_panic_is_the_call_s_error(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path / "m", tokenizer=backtracking_tokenizer())
    tokenizer = Tokenizer.from_folder(folder)
    with pytest.raises(KestrelError) as caught:
        tokenizer.encode(PANIC_TEXT)
    assert caught.value.code == "tokenizer_failed" and "tokenizer" in caught.value.message
    with pytest.raises(KestrelError):
        tokenizer.encode(PANIC_TEXT * 100)  # the batch path (long texts) too
    assert tokenizer.encode("hello") == Tokenizer.from_folder(copy_fixture(tmp_path / "n")).encode("hello")


async def test_a_server_answers_a_tokenizer_panic_with_an_error_and_stays_up(tmp_path: Path) -> None:
    model = load_model(copy_fixture(tmp_path / "m", tokenizer=backtracking_tokenizer()))
    with trio.fail_after(60):
        async with running_server(model) as server:
            answers = [
                await fetch(server.port, "POST", "/v1/completions", {"prompt": PANIC_TEXT, "max_tokens": 2}),
                await fetch(server.port, "POST", "/tokenize", {"prompt": PANIC_TEXT}),
                await fetch(server.port, "POST", "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": PANIC_TEXT}], "max_tokens": 2}),
            ]
            after = await fetch(server.port, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 2})
            health = await fetch(server.port, "GET", "/health")
    for answer in answers:
        error = assert_envelope(answer, 500)
        assert error["code"] == "tokenizer_failed" and "Traceback" not in error["message"], error
    assert after.status == 200 and health.status == 200


def test_a_text_that_cannot_fit_is_refused_before_the_rust_call() -> None:
    tokenizer = Tokenizer.from_demo()
    limit = 100
    too_long = "x" * (tokenizer.char_limit(limit) + 1)
    tokenizer._backend = None  # any call into Rust would now fail
    ids, total = tokenizer.encode_bounded(too_long, limit)
    assert ids is None and total > limit


def test_the_length_bound_is_sound_for_the_longest_tokens() -> None:
    """A text of the longest tokens has no fewer tokens than the bound says (it is a lower bound)."""
    tokenizer = Tokenizer.from_demo()
    longest = max(tokenizer.vocabulary(), key=len)  # 128 bytes of spaces, one token
    text = tokenizer.decode([tokenizer.token_to_id(longest)]) * 50
    assert tokenizer.fewest_tokens(text) <= len(tokenizer.encode(text))


def test_the_longest_token_s_bytes_are_read_id_by_id_as_the_whole_vocabulary_says() -> None:
    """``max_token_bytes`` (read entry by entry, so that no one Rust call holds the GIL for the whole vocabulary)
    is the most bytes any entry of Qwen3's 151,669 decodes to, added tokens included."""
    tokenizer = Tokenizer.from_demo()
    expected = max(len(tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8"))
                   for token_id in tokenizer.vocabulary().values())
    assert tokenizer.max_token_bytes == expected == 128


def test_a_long_text_far_over_the_limit_is_counted_in_pieces() -> None:
    tokenizer = Tokenizer.from_demo()
    text = "lorem ipsum dolor sit amet " * 40_000  # about 1 MB, 200 k tokens
    ids, total = tokenizer.encode_bounded(text, 1000)
    assert ids is None and 1000 < total < 20_000  # stopped after a few pieces
    fits = "word " * 30_000
    ids, total = tokenizer.encode_bounded(fits, 40_000)
    assert ids == tokenizer.encode(fits) and total == len(ids)


def test_four_concurrent_4mb_tokenize_calls_keep_the_high_water_mark() -> None:
    """Through a real server in a child process: /tokenize of 4 MB four at once, then of 2 MB. Its peak (VmHWM) may rise by
    at most 150 MB over its own mark after a small /tokenize; today's main took 900 MB per call."""
    code, result, stderr = run_child("""
        import trio
        from kestrel_trio.model import load_demo_model
        from kestrel_trio.server import serve

        def hwm():
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024

        async def post(port, text, statuses):
            body = json.dumps({"prompt": text}).encode()
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"POST /tokenize HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nContent-Type: application/json\\r\\n"
                                  b"Connection: close\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
            raw = b""
            while chunk := await stream.receive_some(65536):
                raw += chunk
            statuses.append(int(raw.split(b" ", 2)[1]))

        async def main():
            model = load_demo_model()
            async with trio.open_nursery() as nursery:
                server = await nursery.start(lambda task_status: serve(
                    model, host="127.0.0.1", port=0, task_status=task_status))
                small = []
                await post(server.port, "hello " * 1000, small)
                base = hwm()
                limit(1500 * 2**20)
                statuses = []
                phrase = "lorem ipsum dolor sit amet, consectetur adipiscing elit "
                for repeats in (70_000, 35_000):  # 4 MB (refused from its length), 2 MB (counted in pieces)
                    async with trio.open_nursery() as inner:
                        for _ in range(4):
                            inner.start_soon(post, server.port, phrase * repeats, statuses)
                after = []
                await post(server.port, "hello", after)
                report(small=small, statuses=statuses, after=after, rise=hwm() - base)
                nursery.cancel_scope.cancel()

        trio.run(main)
    """)
    assert code == 0 and result is not None, stderr
    assert result["small"] == [200] and result["after"] == [200], result
    assert result["statuses"] == [400] * 8, result
    assert result["rise"] < 150 * 2**20, result
