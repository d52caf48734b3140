"""The host work of one long ask outside its forwards: the prompt's token list and length, its boundaries' bytes
and keys, and the switch a plain 8-bit decode step reads per layer.

Over `bench/gpu_workload.py`'s synthetic repository (131,072 tokens by default, 67 segments), best of five
`timeit` repeats, ms (µs for the switch). The boundaries of a prompt whose segments are all new, by ``token_bytes``'
two paths side by side (`array`: the machine's unsigned int, where it is little-endian uint32; NumPy elsewhere), and
of the same segments again (the bytes `engine.boundaries` kept from the last prompt). No MLX work: runs anywhere.

    python bench/host_time.py                 # table on stdout, JSON under bench/results/
"""
from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import machine, markdown_table, write_json  # noqa: E402
from bench.gpu_workload import synthetic_repository  # noqa: E402
from engine import boundaries as boundaries_module  # noqa: E402
from engine.boundaries import _SegmentBytes, boundaries  # noqa: E402
from engine.decode_kernels import _as_traced  # noqa: E402
from engine.request import Request  # noqa: E402

POLICY = "0123456789abcdef"


def best_ms(call, number: int = 10) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e3


def measure(tokens: int, vocab: int = 151_936) -> dict:
    segments = synthetic_repository(tokens, vocab).prompt(2)
    req = Request(segments=segments, max_tokens=1)
    rows = {"all_token_ids": best_ms(req.all_token_ids),
            "len(all_token_ids())": best_ms(lambda: len(req.all_token_ids())),
            "prompt_length": best_ms(req.prompt_length)}
    def new_segments() -> None:  # every segment's bytes made, as for a prompt none of whose segments came before
        _SegmentBytes._last = {}
        boundaries(POLICY, segments, 2048, None)

    for name, native in (("boundaries, new segments (token_bytes by array)", True),
                         ("boundaries, new segments (token_bytes by NumPy)", False)):
        with mock.patch.object(boundaries_module, "_NATIVE_U32", native):
            rows[name] = best_ms(new_segments)
    rows["boundaries, the last prompt's segments (their bytes kept)"] = best_ms(
        lambda: boundaries(POLICY, segments, 2048, None))
    per_read_us = best_ms(_as_traced.on, number=200_000) * 1e3
    return {"tokens": req.prompt_length(), "segments": len(segments), "ms": {k: round(v, 3) for k, v in rows.items()},
            "split_as_traced_read_us": round(per_read_us, 4),
            "split_as_traced_64_layers_us": round(64 * per_read_us, 2)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=131_072)
    a = ap.parse_args(argv)
    result = {"machine": machine(), **measure(a.tokens)}
    print(markdown_table(["work", "ms"], list(result["ms"].items())))
    print(f"split_as_traced read: {result['split_as_traced_read_us']} µs "
          f"({result['split_as_traced_64_layers_us']} µs over 64 layers)")
    print(f"wrote {write_json('host_time', result)}")
    return result


if __name__ == "__main__":
    main()
