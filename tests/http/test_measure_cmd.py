"""`codectx measure` against a running server: cold with --fresh, then continued runs restore."""
from __future__ import annotations

import hashlib
import json

from engine.boundaries import JOIN_TOKENS, cut_points
from server.cli import main as cli_main
from server.http.chat_prompt import message_segments
from server.measure_cmd import main as measure_main
from server.measure_cmd import messages_for

FILE_TEXT = 'def fib(n):\n    """Fibonacci, slowly."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n' * 6


def _run(capsys, *args: str) -> dict:
    assert cli_main(["measure", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fresh_is_cold_and_a_repeat_restores(api, tmp_path, capsys):
    path = tmp_path / "fib.py"
    path.write_text(FILE_TEXT, encoding="utf-8")
    common = ("--file", str(path), "--url", api.url, "--max-tokens", "4")
    cold = _run(capsys, *common, "--fresh")
    assert cold["sha256"] == hashlib.sha256(FILE_TEXT.encode()).hexdigest()
    assert cold["model"] == api.model_id and cold["fresh"] is True
    assert cold["cached_tokens"] == 0 and cold["recomputed_tokens"] == cold["prompt_tokens"]
    assert cold["prefill_tps"] > 0 and cold["decode_tokens"] >= 1
    assert 0 < cold["ttft_s"] <= cold["total_s"] and cold["client_ttft_s"] is not None
    _run(capsys, *common)
    warm = _run(capsys, *common)
    served = api.source.current()
    header = len(served.tokenizer.encode("<|im_start|>assistant\n"))
    assert warm["prompt_tokens"] < cold["prompt_tokens"]  # no "Run <nonce>" line
    # A repeat restores all but the last forward: the header, with the question before it when that is
    # short (engine.boundaries.JOIN_TOKENS), from the last checkpoint-grid cut on.
    segments = message_segments(served.tokenizer, messages_for(FILE_TEXT, fresh=False))
    cuts = cut_points(segments, served.backend.stats()["prefill_chunk"])
    assert warm["prompt_tokens"] == cuts[-1] == sum(len(s.token_ids) for s in segments)
    assert (warm["cached_tokens"], warm["recomputed_tokens"]) == (cuts[-2], cuts[-1] - cuts[-2])
    assert 0 < warm["recomputed_tokens"] <= header + JOIN_TOKENS


def test_human_report_and_errors(api, tmp_path, capsys):
    path = tmp_path / "small.py"
    path.write_text("x = 1\n", encoding="utf-8")
    assert measure_main(["--file", str(path), "--url", api.url, "--max-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "sha256 " + hashlib.sha256(b"x = 1\n").hexdigest() in out
    assert "restored" in out and "tok/s" in out and "TTFT" in out
    assert measure_main(["--file", str(path), "--url", api.url, "--model", "nope"]) == 1
    assert "HTTP 404" in capsys.readouterr().err
    assert measure_main(["--file", str(tmp_path / "missing.py"), "--url", api.url]) == 2
    assert measure_main(["--file", str(path), "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach" in capsys.readouterr().err
    assert measure_main(["--file", str(path), "--url", "notaurl"]) == 1  # was a ValueError traceback
    assert "notaurl/v1/models is not an http(s) URL" in capsys.readouterr().err
