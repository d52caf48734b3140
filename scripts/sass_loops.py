"""Registers and loop instructions of our CUDA kernels compiled for the H200 (sm_90), on a machine without a GPU.

Each kernel source the engine would build (tests/engine/cuda_compile.py: MLX's ``cuda_kernel`` recorded at the
shapes `tests/engine/test_cuda_compile.launch_every_kernel` calls) is compiled by NVRTC (the dev extras' wheel)
into a cubin, disassembled by ``cuobjdump -sass`` (PyPI wheel ``nvidia-cuda-cuobjdump``: unzip it, make
``nvidia/cu13/bin/cuobjdump`` executable and pass it with ``--cuobjdump``), and each loop (a backward branch and
its target) counted by opcode. A loop's count holds every path through its body (a branch's skipped side
too): read the listing (``--dump``) for the path a tile takes. docs/benchmarks.md cites the counts this prints.

    .venv/bin/python scripts/sass_loops.py attention_transposed --cuobjdump /path/to/cuobjdump
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kernel_sources(pattern: str) -> dict[str, str]:
    """The recorded kernel sources whose label matches `pattern`."""
    from tests.engine import test_cuda_compile
    from tests.engine.cuda_compile import record_kernels

    recorder = record_kernels(test_cuda_compile.FACTORIES)
    test_cuda_compile.launch_every_kernel()
    return {label: source for label, source in recorder.sources().items() if re.search(pattern, label)}


def loops(sass: str) -> list[tuple[int, int, list[str]]]:
    """(start, end, instructions) of each loop in a `cuobjdump -sass` listing."""
    listing = [(int(m.group(1), 16), m.group(2).strip())
               for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    found = []
    for at, text in listing:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < at:
            start = int(target.group(1), 16)
            found.append((start, at, [t for a, t in listing if start <= a <= at]))
    return sorted(found, key=lambda loop: -len(loop[2]))


def opcode(instruction: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pattern", nargs="?", default="attention", help="a regular expression over kernel labels")
    ap.add_argument("--cuobjdump", default="cuobjdump")
    ap.add_argument("--dump", help="a folder for each kernel's full listing")
    a = ap.parse_args(argv)
    from tests.engine.cuda_compile import cubin, resources

    for label, source in kernel_sources(a.pattern).items():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin(source))
            f.flush()
            sass = subprocess.run([a.cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        if a.dump:
            Path(a.dump, f"{label}.sass").write_text(sass)
        print(f"{label}: {resources(source)}")
        for start, end, body in loops(sass)[:2]:
            counts = collections.Counter(opcode(i) for i in body)
            print(f"  loop {start:#x}-{end:#x}: {len(body)} instructions: "
                  + ", ".join(f"{k} {v}" for k, v in counts.most_common(16)))


if __name__ == "__main__":
    main()
