"""`codectx doctor`: one line per check, `ready:` last, exit code 0 only when ready."""
from __future__ import annotations

import io
import json
import os

from engine import mlx_env
from engine.default_model import GGUF_NAME, GGUF_SHA256, default_model_dir
from server.doctor import check_mlx, run_doctor


def _doctor() -> tuple[int, list[str]]:
    out = io.StringIO()
    code = run_doctor(out=out)
    return code, out.getvalue().splitlines()


def test_fresh_home_is_ready_and_reports_every_check(tmp_path, monkeypatch, graph_cache_unset):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path / "home"))
    code, lines = _doctor()
    assert code == 0
    assert lines[-1] == "ready: true"
    names = [line[6:].split(":", 1)[0] for line in lines[:-1]]
    assert names == ["python", "mlx", "blas", "default model", "model choice", "cache dir", "archive", "linear mode"]
    # MLX's start-up settings, as the engine's start-up step (engine.mlx_env.apply) then sets them; the doctor
    # itself sets nothing
    assert "MLX_CUDA_GRAPH_CACHE_SIZE" not in os.environ
    assert mlx_env.apply() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"}
    assert lines[1].endswith(", MLX_CUDA_GRAPH_CACHE_SIZE=" + os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"])
    monkeypatch.setenv("MLX_CUDA_GRAPH_CACHE_SIZE", "7")  # a user's own value is the one reported
    assert check_mlx().detail.endswith(", MLX_CUDA_GRAPH_CACHE_SIZE=7")
    # the CPU build dequantizes weights at load: compute.linear has nothing to choose, and says so
    assert lines[-2] == ("ok    linear mode: weights are dequantized to float32 at load on this device: "
                         "no quantized layers to choose for")
    assert any("not cached yet" in line for line in lines)
    # nothing in the (empty) libraries: a warning naming what to get, not a failure
    assert any(line.startswith("warn  model choice: no models found") for line in lines)
    assert (tmp_path / "home").is_dir()


def test_unwritable_home_is_not_ready(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CODECTX_HOME", str(blocker))
    code, lines = _doctor()
    assert code == 1
    assert lines[-1] == "ready: false"
    assert any(line.startswith("FAIL  cache dir") for line in lines)


def test_corrupt_cached_default_model_is_not_ready(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path / "home"))
    cached = default_model_dir()
    cached.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (cached / name).write_text("{}")
    (cached / GGUF_NAME).write_bytes(b"GGUF but far too short")
    (cached / "codectx-source.json").write_text(json.dumps({"sha256": GGUF_SHA256}))
    code, lines = _doctor()
    assert code == 1
    assert any(line.startswith("FAIL  default model") and "bytes" in line for line in lines)


def test_on_a_quantizing_device_it_lists_the_measured_linear_modes_and_decode_kernels(tmp_path, monkeypatch):
    """Where weights stay quantized (a GPU), the cached measurements are read back: linear mode and our kernels."""
    from engine import loaded_model
    from engine.linear_mode_cache import LinearModeCache

    monkeypatch.setenv("CODECTX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(loaded_model, "weight_dtype", lambda: None)
    cache = LinearModeCache()
    cache.put("a" * 16, {64: (1.0, 1.2), 128: (1.0, 0.5), 256: (2.0, 0.5)})
    cache.put("b" * 16, {"qmv": (2e-3, 1e-3), "attention": (1e-3, 2e-3)})
    from server.doctor import check_linear_mode

    check = check_linear_mode()
    assert check.ok and "2 model shape(s) measured" in check.detail
    assert "dequantized from 128 rows" in check.detail and "decode kernels: qmv" in check.detail
    assert "qmv+attention" not in check.detail
