"""`codectx measure`: time one request against a running `codectx serve --http`.

The file's text becomes the system message and a fixed question follows, so
a second run (without --fresh) continues from the checkpoints the first one
left: it reports how many prompt tokens were restored and how many
recomputed. `--fresh` puts a unique line before the file, so nothing can be
restored and the run is cold. The report (stdout): prompt, restored and
recomputed tokens, prefill time and tok/s, time to first token (server and
client), decode tok/s, the miss reason and the file's SHA-256.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8765"
QUESTION = "Summarize the file above in three sentences."


class MeasureError(Exception):
    """The server could not be reached or refused the request."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codectx measure", description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, required=True, help="the file whose text is the prompt")
    parser.add_argument("--fresh", action="store_true", help="cold: make sure nothing can be restored")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to decode (default 64)")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    parser.add_argument("--model", help="model name (default: the server's first plain model)")
    parser.add_argument("--api-key", help="API key (default $CODECTX_API_KEY)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _open(url: str, api_key: str | None, body: dict | None = None, timeout: float = 600) -> Any:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode("utf-8") if body is not None else None
    try:
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    except ValueError as err:  # no scheme, or one urllib cannot open
        raise MeasureError(f"{url} is not an http(s) URL ({err})") from err
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - the user's own server
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = err.reason
        raise MeasureError(f"{url}: HTTP {err.code}: {message}") from err
    except (urllib.error.URLError, OSError) as err:
        raise MeasureError(f"cannot reach {url}: {getattr(err, 'reason', err)}") from err


def default_model(base: str, api_key: str | None) -> str:
    """The first model listed that is not the repository model."""
    try:
        with _open(f"{base}/v1/models", api_key) as response:
            ids = [m["id"] for m in json.load(response)["data"]]
    except (ValueError, KeyError, TypeError, OSError) as err:  # (JSON errors are ValueErrors)
        raise MeasureError(f"{base}/v1/models is not an OpenAI-compatible model list: {err!r}") from err
    plain = [i for i in ids if i != "codectx"]
    if not plain:
        raise MeasureError(f"{base} lists no models")
    return plain[0]


def messages_for(text: str, fresh: bool) -> list[dict[str, str]]:
    """System message with the file (a unique first line when fresh), then the question."""
    head = f"Run {uuid.uuid4().hex}.\n" if fresh else ""
    return [{"role": "system", "content": head + text}, {"role": "user", "content": QUESTION}]


def measure(base: str, model: str, text: str, *, fresh: bool, max_tokens: int,
            api_key: str | None = None) -> dict[str, Any]:
    """Stream one chat completion and return the report's numbers.

    Raises:
        MeasureError: The server is unreachable, refused the request or sent no usage.
    """
    body = {"model": model, "messages": messages_for(text, fresh), "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first_token = None
    final: dict[str, Any] | None = None
    try:
        with _open(f"{base}/v1/chat/completions", api_key, body) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    raise MeasureError(f"generation failed: {event['error']}")
                if event.get("choices") and event["choices"][0]["delta"].get("content") and first_token is None:
                    first_token = time.perf_counter() - start
                if event.get("usage"):
                    final = event
    except OSError as err:  # the connection reset or timed out mid-stream
        raise MeasureError(f"the stream from {base} broke: {err}") from err
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise MeasureError(f"{base} streamed an event that is not a chat completion chunk: {err!r}") from err
    total = time.perf_counter() - start
    if final is None:
        raise MeasureError("the server sent no usage chunk")
    m = final.get("codectx")
    if not isinstance(m, dict):
        raise MeasureError(f"{base} is not a codectx server: its usage chunk has no 'codectx' timings")
    return {"prompt_tokens": m["prompt_tokens"], "cached_tokens": m["cached_tokens"],
            "recomputed_tokens": m["recomputed_tokens"], "prefill_s": m["prefill_s"],
            "prefill_tps": m["prefill_tps"], "ttft_s": m["ttft_s"], "client_ttft_s": first_token,
            "decode_tokens": m["decode_tokens"], "decode_tps": m["decode_tps"], "acceptance": m["acceptance"],
            "miss_reason": m["miss_reason"], "total_s": total}


def format_report(path: Path, digest: str, size: int, model: str, fresh: bool, r: dict[str, Any]) -> str:
    """The human-readable report."""
    client_ttft = f"{r['client_ttft_s']:.3f} s" if r["client_ttft_s"] is not None else "-"
    return "\n".join([
        f"file        {path} ({size} bytes, sha256 {digest})",
        f"model       {model} ({'cold, --fresh' if fresh else 'continued'})",
        f"prompt      {r['prompt_tokens']} tokens: {r['cached_tokens']} restored, "
        f"{r['recomputed_tokens']} recomputed (miss: {r['miss_reason'] or 'none'})",
        f"prefill     {r['prefill_s']:.3f} s, {r['prefill_tps']:.1f} tok/s",
        f"TTFT        {r['ttft_s']:.3f} s (server), {client_ttft} (client)",
        f"decode      {r['decode_tokens']} tokens, {r['decode_tps']:.1f} tok/s, "
        f"acceptance {100 * r['acceptance']:.0f}%",
        f"total       {r['total_s']:.3f} s",
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data = args.file.read_bytes()
    except OSError as err:
        sys.stderr.write(f"codectx measure: cannot read {args.file}: {err.strerror}\n")
        return 2
    if args.max_tokens < 1:
        sys.stderr.write("codectx measure: --max-tokens must be >= 1\n")
        return 2
    base = args.url.rstrip("/")
    api_key = args.api_key or os.environ.get("CODECTX_API_KEY") or None
    try:
        model = args.model or default_model(base, api_key)
        report = measure(base, model, data.decode("utf-8", errors="replace"), fresh=args.fresh,
                         max_tokens=args.max_tokens, api_key=api_key)
    except MeasureError as err:
        sys.stderr.write(f"codectx measure: {err}\n")
        return 1
    digest = hashlib.sha256(data).hexdigest()
    if args.json:
        sys.stdout.write(json.dumps({"file": str(args.file), "sha256": digest, "bytes": len(data), "model": model,
                                     "fresh": args.fresh, **report}, indent=2) + "\n")
    else:
        sys.stdout.write(format_report(args.file, digest, len(data), model, args.fresh, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
