"""A small Python repository for the focus tests: a module that does not fit the stable budget."""
from __future__ import annotations

from pathlib import Path

BLAS = ('"""OpenBLAS under the matmuls."""\n\n\n'
        "def preload(path=None):\n"
        '    """Loads the library before anything imports MLX."""\n'
        "    handle = _open(path)\n"
        "    return handle\n\n\n"
        "def _open(path):\n"
        "    return path or 'libopenblas.so'\n\n\n"
        + "".join(f"def filler_{i}(x):\n    return x + {i}\n\n\n" for i in range(40)))
"""A module large enough that it is not kept whole under the test budget, nor fits the focus whole."""


def write_repo(root: Path) -> Path:
    files = {"README.md": "# demo\n", "pkg/__init__.py": "", "pkg/blas.py": BLAS,
             "pkg/small.py": "LIMIT = 3\n\n\ndef clamp(x):\n    return min(x, LIMIT)\n",
             "pkg/user.py": "from .blas import preload\n\n\ndef start():\n    return preload('x')\n",
             "pkg/a_queue.py": "def submit(job):\n    return [job]\n",
             "pkg/engine.py": "class Engine:\n    def submit(self, job):\n        return job\n"}
    files.update({f"pkg/m{i}.py": "".join(f"def f{i}_{j}(x):\n    return x * {j}\n\n\n" for j in range(12))
                  for i in range(12)})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root
