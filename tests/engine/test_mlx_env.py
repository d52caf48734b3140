"""MLX's start-up settings: our defaults where the user set nothing, the user's value otherwise."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine import mlx_env

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_fill_only_what_the_user_left_unset(monkeypatch):
    monkeypatch.setenv("MLX_CUDA_GRAPH_CACHE_SIZE", "")  # recorded, so the test's end restores the variable
    monkeypatch.delenv("MLX_CUDA_GRAPH_CACHE_SIZE")
    assert mlx_env.current() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"} and "MLX_CUDA_GRAPH_CACHE_SIZE" not in os.environ
    assert mlx_env.apply() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"}
    monkeypatch.setenv("MLX_CUDA_GRAPH_CACHE_SIZE", "7")
    assert mlx_env.apply() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "7"}
    assert os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"] == "7"


def test_the_start_up_step_applies_them_before_mlx_is_imported(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLX_CUDA_GRAPH_CACHE_SIZE"} | {"CODECTX_HOME": str(tmp_path)}
    code = ("import json, os, sys, engine.blas; engine.blas.preload('off'); "
            "print(json.dumps([os.environ.get('MLX_CUDA_GRAPH_CACHE_SIZE'), 'mlx.core' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["1000", False]
