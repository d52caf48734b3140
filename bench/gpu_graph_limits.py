"""The decode step under MLX's CUDA graph limits: one fresh process per setting, the same rows in each.

MLX's CUDA backend records operations into a CUDA graph and closes it after ``MLX_MAX_OPS_PER_BUFFER``
operations or ``MLX_MAX_MB_PER_BUFFER`` megabytes of inputs (100 and 1,000 on Hopper), and `mx.async_eval`
blocks while more than ten closed graphs are running. At 128k keys a layer's weights and KV buffers
pass 500 MB, so by that rule a decode step is 32-64 graphs (derived from the sizes, not counted). Whether fewer, larger graphs make the step
faster is what this measures. MLX reads the limits once per process, so each setting runs
`bench/gpu_step.py` in a process of its own (``--writes`` picks its rows; the engine's path by
default), and the table puts the settings side by side, the first (MLX's defaults) as the base.

    # on the lent H200 (device tool, carry [".gpu"]):
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_graph_limits.py --out $OUT/gpu_graph_limits.json
    python bench/gpu_graph_limits.py --shape tiny --lengths 1024 --steps 4 --writes mlx --out /tmp/limits.json   # CPU
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import markdown_table, save_json  # noqa: E402

SETTINGS = ("default", "MLX_MAX_MB_PER_BUFFER=100000",
            "MLX_MAX_MB_PER_BUFFER=100000:MLX_MAX_OPS_PER_BUFFER=400")
"""Each: MLX's defaults, or ``NAME=value`` pairs joined by ``:``."""


def environment(setting: str) -> dict[str, str]:
    """This process's environment with `setting`'s variables (MLX's graph limits otherwise unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER")}
    if setting != "default":
        for pair in setting.split(":"):
            name, _, value = pair.partition("=")
            if not name.startswith("MLX_") or not value:
                raise SystemExit(f"not a setting: {pair!r} (NAME=value, NAME an MLX variable)")
            env[name] = value
    return env


def run_setting(setting: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    """`bench/gpu_step.py`'s rows under `setting`, in a process of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_step.py"), "--lengths", a.lengths, "--bits", a.bits,
                        "--steps", str(a.steps), "--shape", a.shape, "--writes", a.writes, "--out", str(out)],
                       env=environment(setting), check=True)
        result = json.loads(out.read_text())
    return [{"setting": setting, "mlx_env": result["mlx_env"], **row} for row in result["rows"]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated; see SETTINGS")
    ap.add_argument("--lengths", default="131072")
    ap.add_argument("--bits", default="8,16")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--shape", default="qwen3-32b")
    ap.add_argument("--writes", default="ours+traced+fused", help="bench/gpu_step.py's rows to run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_graph_limits.json"))
    a = ap.parse_args(argv)
    rows = [row for setting in a.settings.split(",") for row in run_setting(setting, a)]
    base = {(r["context"], r["kv_bits"], r["write"]): r["pipelined_ms"] for r in rows if r["setting"] == rows[0]["setting"]}
    print(markdown_table(["setting", "context", "KV bits", "row", "pipelined ms", "vs first", "host ms", "sync ms"],
                         [[r["setting"], r["context"], r["kv_bits"], r["write"], f"{r['pipelined_ms']:.2f}",
                           f"{r['pipelined_ms'] / base[(r['context'], r['kv_bits'], r['write'])]:.2f}x",
                           f"{r['pipelined_host_ms']:.2f}", f"{r['sync_ms']:.2f}"] for r in rows]))
    result = {"settings": a.settings.split(","), "rows": rows}
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
