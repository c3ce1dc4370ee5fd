"""Graceful shutdown of the real ``kestrel-trio serve`` process (demo model):
SIGTERM while streams run. Short streams finish, endless ones end with an error
event and ``[DONE]``, no new connection is accepted, and the exit code is 0.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
import trio
from rel_kit import HOST, RawClient, completion_json, event_count, wait_until

GRACE = 3.0  # s, the --grace given to the server
SERVE = [sys.executable, "-m", "kestrel_trio.cli", "serve", "--port", "0", "--grace", str(GRACE), "--max-batch", "4"]


async def start_stream(port: int, max_tokens: int) -> RawClient:
    client = await RawClient.connect(port)
    await client.send_request("POST", "/v1/completions", json.dumps(completion_json(max_tokens, stream=True)).encode())
    assert (await client.read_head()).status_code == 200
    return client


async def read_rest(client: RawClient, bodies: dict[str, bytes], name: str, so_far: bytes) -> None:
    bodies[name] = so_far + await client.read_body()
    await client.aclose()


def log_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@pytest.mark.slow
async def test_sigterm_drains_streams_refuses_connections_and_exits_zero(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    with trio.fail_after(90), open(log_path, "wb") as log_file:
        process = await trio.lowlevel.open_process(SERVE, stdout=log_file, stderr=log_file)
        try:
            await wait_until(lambda: re.search(r"serving \S+ at http://[^:]+:(\d+)/v1", log_text(log_path))
                             is not None or process.poll() is not None, interval=0.05)
            port = int(re.search(r"serving \S+ at http://[^:]+:(\d+)/v1", log_text(log_path)).group(1))

            endless = [await start_stream(port, 4000) for _ in range(2)]  # minutes of steps: cannot finish
            short = await start_stream(port, 30)
            first = {}
            for name, client in [("endless0", endless[0]), ("endless1", endless[1]), ("short", short)]:
                first[name] = await client.read_body(enough=lambda body: event_count(body) >= 2)

            process.send_signal(signal.SIGTERM)
            await wait_until(lambda: "shutting down" in log_text(log_path), interval=0.02)
            with pytest.raises(OSError):
                late = await trio.open_tcp_stream(HOST, port)
                await late.aclose()

            bodies: dict[str, bytes] = {}
            async with trio.open_nursery() as nursery:
                for name, client in [("endless0", endless[0]), ("endless1", endless[1]), ("short", short)]:
                    nursery.start_soon(read_rest, client, bodies, name, first[name])
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    log = log_text(log_path)
    assert code == 0, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
    for name in ("endless0", "endless1"):
        payloads = [p for p in bodies[name].decode().split("\n\n") if p]
        assert payloads[-1] == "data: [DONE]", payloads[-2:]
        error = json.loads(payloads[-2].removeprefix("data: "))["error"]
        assert error["type"] == "server_error" and error["message"]
    short_payloads = [p for p in bodies["short"].decode().split("\n\n") if p]
    assert short_payloads[-1] == "data: [DONE]"
    assert json.loads(short_payloads[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
