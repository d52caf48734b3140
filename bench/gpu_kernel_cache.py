"""Checks on a GPU that `engine.cuda_kernel_cache` writes our kernels where MLX's CUDA backend reads them.

Three checks, in a fresh process with its own MLX PTX cache folder (``--ptx-dir``, emptied first):

1. **text**: MLX's generated source for a probe kernel (printed by MLX with ``verbose=True``) is byte for byte
   `cuda_kernel_cache.mlx_source`'s, so the module name we derive from it is the one MLX looks for.
2. **MLX loads what we wrote**: a second probe's module is written with a *different* body (every output 42) under
   the name MLX derives for the real body; the launch then returns 42s, not the real body's values: MLX read the
   file and compiled nothing.
3. **seeded through the engine's path**: a third probe made through `engine.cuda_backend.kernel` (with seeding on)
   writes its module at first launch and returns the real body's values from the code we compiled.

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_kernel_cache.py --out $OUT/kernel_cache.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BODY = """
  uint32_t i = threadIdx.x + blockIdx.x * blockDim.x;
  if (i < (uint32_t)inp_shape[0]) {
    out[i] = inp[i] + static_cast<T>(N) + static_cast<T>(scale[0]);
  }
"""
FORTY_TWO = """
  uint32_t i = threadIdx.x + blockIdx.x * blockDim.x;
  if (i < (uint32_t)inp_shape[0]) {
    out[i] = static_cast<T>(42);
  }
"""


def stdout_of(call: Callable[[], Any]) -> str:
    """What `call` wrote to file descriptor 1 (MLX prints from C++, below Python's `sys.stdout`)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            call()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        return sink.read().decode(errors="replace")


def safely(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - reported, the checks go on
        return repr(error)


def probe(name: str, body: str) -> Any:
    import mlx.core as mx
    return mx.fast.cuda_kernel(name=name, input_names=["inp", "scale"], output_names=["out"], source=body)


def launch(kernel: Any, **extra: Any) -> Any:
    import mlx.core as mx
    inp = mx.arange(8, dtype=mx.float32)
    out = kernel(inputs=[inp, mx.array([0.5], dtype=mx.float32)], template=[("N", 3), ("T", mx.float32)],
                 grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[mx.float32], **extra)[0]
    mx.eval(out)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ptx-dir", default="/tmp/codectx-kernel-cache-check")
    ap.add_argument("--out", default="bench/results/gpu_kernel_cache.json")
    a = ap.parse_args(argv)
    shutil.rmtree(a.ptx_dir, ignore_errors=True)
    os.environ["MLX_PTX_CACHE_DIR"] = a.ptx_dir
    os.environ["CODECTX_CUDA_KERNEL_CACHE"] = "1"  # on whether or not this MLX is in VERIFIED_MLX
    import mlx.core as mx

    from engine import cuda_backend, cuda_kernel_cache as kc, nvrtc

    result: dict[str, Any] = dict(mlx=mx.__version__, device_info=mx.device_info(), ptx_dir=a.ptx_dir,
                                  folder=str(kc.ptx_folder()), enabled=kc.enabled(), arch=kc.device_arch(),
                                  nvrtc=safely(nvrtc.nvrtc_version), driver=safely(nvrtc.driver_version),
                                  include=str(nvrtc.cuda_include()))
    inp_dtypes = [(mx.float32, 1), (mx.float32, 1)]
    template = [("N", 3), ("T", mx.float32)]
    printed = stdout_of(lambda: launch(probe("probe_text", BODY), verbose=True))
    text = printed.split("```\n", 1)[1].rsplit("\n```", 1)[0] if "```\n" in printed else printed
    ours = kc.mlx_source(kc.kernel_name("probe_text", template), "", BODY, ["inp", "scale"], inp_dtypes, ["out"], [mx.float32], template)
    result["text_matches"] = text == ours
    if text != ours:
        result["text_mlx"], result["text_ours"] = text, ours

    seeder = kc.KernelSeeder(kc.ptx_folder(), kc.device_arch())
    forged = kc.Definition("probe_forged", "", FORTY_TWO, ("inp", "scale"), ("out",))
    real = kc.Definition("probe_forged", "", BODY, ("inp", "scale"), ("out",))
    seeder.seed_as(real, forged, inp_dtypes, template, [mx.float32])
    result["forged_output"] = launch(probe("probe_forged", BODY)).tolist()
    result["mlx_loaded_our_file"] = result["forged_output"] == [42.0] * 8

    seeded = cuda_backend.kernel("probe_seeded", BODY, input_names=["inp", "scale"], output_names=["out"])
    before = sum(1 for _ in Path(kc.ptx_folder()).rglob("*.ptx"))
    values = launch(seeded).tolist()
    result["seeded_output"] = values
    result["seeded_correct"] = values == [i + 3.5 for i in range(8)]
    result["seeded_files_written"] = sum(1 for _ in Path(kc.ptx_folder()).rglob("*.ptx")) - before
    print(json.dumps(result, indent=1, default=str))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
