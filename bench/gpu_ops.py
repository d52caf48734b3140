"""What one MLX operation costs on the host and on the GPU, by kind: the decode step's floor.

A decode step at long context is some 1,600 small operations (64 layers of projections,
norms, RoPE, the cache write, attention). When the host takes longer to build and submit
them than the GPU takes to run them, the step is host-bound and fewer bytes (an 8-bit cache)
cannot make it faster. For each kind of operation the decode step uses, this builds
``--ops`` of them (independent, one-row sized as in decode), then reports per operation:

- ``build_us``: the Python call that adds it to the graph;
- ``submit_us``: `mx.async_eval`'s share (MLX encodes each operation for the GPU here);
- ``wall_us``: build, submit and the GPU's run until `mx.synchronize` returns.

Then the donation rows (`donation`): whether a one-row write into a cache buffer of 4,096 and of
131,072 rows copies the buffer when the previous step, still queued, holds it.

    # on the lent H200 (device tool, carry [".gpu"]):
    bash .gpu/install.sh && python3 bench/gpu_ops.py --out $OUT/gpu_ops.json
    python bench/gpu_ops.py --ops 64 --out /tmp/gpu_ops.json   # CPU smoke run (no custom kernel)
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()

import mlx.core as mx  # noqa: E402

from bench._common import markdown_table, save_json  # noqa: E402
from engine import cuda_backend  # noqa: E402

_TINY = r"""
  const int i = threadIdx.x;
  if (i < a_shape[0]) out[i] = a[i] + static_cast<T>(meta[0]);
"""


@functools.lru_cache(maxsize=1)
def _tiny() -> Any:
    """The probe kernel (one for both sections: MLX may cache compiled kernels by name)."""
    return cuda_backend.kernel("codectx_probe_tiny", _TINY, input_names=["a", "meta"], output_names=["out"],
                               ensure_row_contiguous=False)


def kinds(capacity: int) -> dict[str, Callable[[int], Any]]:
    """Each kind's one operation, given its index (operations of a kind are independent)."""
    row = mx.random.normal((1, 8, 1, 128)).astype(mx.bfloat16)
    packed = mx.zeros((1, 8, capacity, 32), dtype=mx.uint32)
    dense = mx.zeros((1, 8, capacity, 128), dtype=mx.bfloat16)
    small = mx.random.normal((64, 128)).astype(mx.bfloat16)
    meta = mx.array([3], dtype=mx.int32)
    mx.eval(row, packed, dense, small, meta)
    words = mx.quantize(row, group_size=64, bits=8)[0]

    def write_packed(i: int) -> Any:
        packed[..., i:i + 1, :] = words
        return packed

    def write_dense(i: int) -> Any:
        dense[..., i:i + 1, :] = row
        return dense

    table = {
        "add": lambda i: small + 1.0,
        "rms_norm": lambda i: mx.fast.rms_norm(small, None, 1e-6),
        "quantize_row": lambda i: mx.quantize(row, group_size=64, bits=8)[0],
        "write_row_8bit_words": write_packed,
        "write_row_bf16": write_dense,
        "host_array": lambda i: mx.array([i, 7], dtype=mx.int32) + 0,
    }
    if cuda_backend.cuda_available():
        def custom(i: int) -> Any:
            return _tiny()(inputs=[small.reshape(-1), meta], template=[("T", mx.bfloat16)], grid=(128, 1, 1),
                        threadgroup=(128, 1, 1), output_shapes=[(small.size,)], output_dtypes=[mx.bfloat16])[0]

        table["custom_kernel"] = custom
    return table


def measure(op: Callable[[int], Any], count: int, attempts: int = 3) -> dict[str, float]:
    """Per-operation microseconds of the last of `attempts` batches of `count` operations."""
    row: dict[str, float] = {}
    for _ in range(attempts):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [op(i) for i in range(count)]
        t1 = time.perf_counter()
        mx.async_eval(outs)
        t2 = time.perf_counter()
        mx.synchronize()
        t3 = time.perf_counter()
        row = {"build_us": (t1 - t0) / count * 1e6, "submit_us": (t2 - t1) / count * 1e6,
               "wall_us": (t3 - t0) / count * 1e6}
        del outs
    return row


def donation(capacity: int, steps: int = 64) -> dict[str, Any]:
    """Whether a one-row write into a cache buffer copies the buffer: `steps` pipelined steps, each
    writing a row and then reading the buffer (our kernel reads it whole and unsliced, as the 8-bit
    decode attention does; MLX's reader takes a one-row view, as the bf16 path's slices do).
    A step whose time grows with `capacity`, or a peak that grows by buffers, is copying."""
    words = mx.quantize(mx.random.normal((1, 8, 1, 128)).astype(mx.bfloat16), group_size=64, bits=8)[0]
    meta = mx.array([3], dtype=mx.int32)
    tiny = _tiny() if cuda_backend.cuda_available() else None

    def kernel_read(buf: mx.array) -> mx.array:
        return tiny(inputs=[buf, meta], template=[("T", mx.uint32)], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[(4,)], output_dtypes=[mx.uint32])[0]

    if tiny is not None:  # compiled before any step is timed
        mx.eval(kernel_read(mx.zeros((1, 8, 1, 32), dtype=mx.uint32)))
    row: dict[str, Any] = {"capacity": capacity}
    for reader in ("kernel", "view") if tiny is not None else ("view",):
        buf = mx.zeros((1, 8, capacity, 32), dtype=mx.uint32)
        mx.eval(buf)
        mx.synchronize()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        start = time.perf_counter()
        prev = None
        for i in range(steps):
            buf[..., i:i + 1, :] = words
            out = kernel_read(buf) if reader == "kernel" else buf[..., i:i + 1, :] + 0
            mx.async_eval(out)
            if prev is not None:
                mx.eval(prev)
            prev = out
        mx.eval(prev)
        mx.synchronize()
        row[f"{reader}_step_us"] = (time.perf_counter() - start) / steps * 1e6
        row[f"{reader}_peak_extra_mb"] = (mx.get_peak_memory() - base) / 1e6
        del buf, prev, out
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1024, help="operations per batch")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_ops.json"))
    a = ap.parse_args(argv)
    rows = []
    for name, op in kinds(max(4096, a.ops)).items():
        rows.append({"kind": name, **measure(op, a.ops)})
    print(markdown_table(["kind", "build µs", "submit µs", "wall µs"],
                         [[r["kind"], r["build_us"], r["submit_us"], r["wall_us"]] for r in rows]), flush=True)
    copies = [donation(c) for c in (4096, 131072)]
    for c in copies:
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()), flush=True)
    result = {"mlx": mx.__version__, "device": str(mx.default_device()), "mlx_env": mlx_env.current(),
              "ops": a.ops, "rows": rows, "donation": copies}
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
