"""MLX's start-up settings: our defaults where the user set nothing, the user's value otherwise."""
from __future__ import annotations

import json
import os

from engine import mlx_env


def test_defaults_fill_only_what_the_user_left_unset(graph_cache_unset, monkeypatch):
    assert mlx_env.current() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"} and "MLX_CUDA_GRAPH_CACHE_SIZE" not in os.environ
    assert mlx_env.apply() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"}
    monkeypatch.setenv("MLX_CUDA_GRAPH_CACHE_SIZE", "7")
    assert mlx_env.apply() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "7"}
    assert os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"] == "7"


def test_graph_limits_are_left_to_mlx_and_reported_where_the_user_set_them(graph_cache_unset, monkeypatch):
    for name in mlx_env.REPORTED:
        monkeypatch.delenv(name, raising=False)
    assert set(mlx_env.apply()) == {"MLX_CUDA_GRAPH_CACHE_SIZE"}
    assert not any(name in os.environ for name in mlx_env.REPORTED)  # nothing of ours is set
    monkeypatch.setenv("MLX_MAX_MB_PER_BUFFER", "100000")
    assert mlx_env.current() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000", "MLX_MAX_MB_PER_BUFFER": "100000"}


def test_the_start_up_step_applies_them_before_mlx_is_imported(tmp_path, run_python):
    code = ("import json, os, sys, engine.blas; engine.blas.preload('off'); "
            "print(json.dumps([os.environ.get('MLX_CUDA_GRAPH_CACHE_SIZE'), 'mlx.core' in sys.modules]))")
    out = run_python(code, tmp_path, unset=["MLX_CUDA_GRAPH_CACHE_SIZE"])
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["1000", False]
