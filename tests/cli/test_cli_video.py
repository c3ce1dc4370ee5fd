"""``serve``'s video flags reach the server's video policy, and a bad value is refused before anything loads."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from cli_kit import run_cli, start_serve, stop

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LM = FIXTURES / "qwen3_vl_gguf" / "lm-f16.gguf"
MMPROJ = FIXTURES / "qwen3_vl_gguf" / "mmproj-f16.gguf"
FRAME = "data:image/png;base64,AAAA"  # never decoded: the frame count is refused first


def test_max_video_frames_bounds_a_frame_list() -> None:
    process, url, _ = start_serve("--grace", "0", "--model", str(LM), "--mmproj", str(MMPROJ),
                                  "--max-video-frames", "3", "--video-fps", "1")
    body = {"model": "lm-f16", "max_tokens": 1,
            "messages": [{"role": "user", "content": [{"type": "video", "video": [FRAME] * 4}]}]}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("a 4-frame video was accepted under --max-video-frames 3")
        except urllib.error.HTTPError as exc:
            status, error = exc.code, json.loads(exc.read())["error"]
    finally:
        stop(process)
    assert status == 400 and error["param"] == "messages[0].content[0].video"
    assert "at most 3 frames per video" in error["message"]


def test_bad_video_flags_exit_2_naming_the_flag() -> None:
    for flag, value in (("--video-fps", "0"), ("--max-video-frames", "1"), ("--max-video-bytes", "0")):
        result = run_cli(["serve", "--port", "0", flag, value], timeout=60)
        assert result.returncode == 2, result.stderr
        assert flag in result.stderr
