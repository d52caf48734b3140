"""Team sharing: two checkouts of the same files on different absolute paths give byte-identical
stable prefixes (what an engine server's prefix cache keys on), so a second developer's first
request reuses the first developer's prefix on a shared server."""
from __future__ import annotations

import shutil

from engine.loading import load_tokenizer
from server.core.prompt import Turn
from server.core.ready import workspace_prompt
from server.core.session import LoadingSession, NoBuffers
from server.core.settings import Settings
from tests.engine.tiny_models import build_tiny_model
from tests.server.harness import write_sample_workspace


def prefix_of(root, tokenizer) -> tuple[list[tuple[str, str]], list[int], str]:
    """The stable prefix of `root`'s workspace prompt: (kind, key) per segment, token ids, text."""
    prompt = workspace_prompt(LoadingSession(Settings(), NoBuffers(), root), tokenizer, 8192)
    segments = prompt.prefix_segments()
    ids = [t for s in segments for t in s.token_ids]
    return [(str(s.kind), s.key) for s in segments], ids, tokenizer.decode(ids)


def test_two_checkouts_on_different_paths_send_the_same_prefix_bytes(tmp_path):
    first = tmp_path / "alice" / "src" / "project"
    first.mkdir(parents=True)
    write_sample_workspace(first)
    (first / "pkg").mkdir()
    (first / "pkg" / "deep.py").write_text("def deep():\n    return 'deep'\n", encoding="utf-8")
    (first / "README.md").write_text("# project\n", encoding="utf-8")
    second = tmp_path / "bob-checkout"
    shutil.copytree(first, second)
    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                             num_attention_heads=2, num_key_value_heads=1)
    tokenizer = load_tokenizer(str(model))[0]

    layout_a, ids_a, text_a = prefix_of(first, tokenizer)
    layout_b, ids_b, text_b = prefix_of(second, tokenizer)
    assert ("file", "pkg/deep.py") in layout_a  # keys are relative paths
    assert layout_a == layout_b and ids_a == ids_b and text_a.encode() == text_b.encode()
    assert str(tmp_path) not in text_a and "alice" not in text_a and "bob" not in text_b

    # The question and the hot tail come after the prefix: they change nothing before it.
    prompt = workspace_prompt(LoadingSession(Settings(), NoBuffers(), second), tokenizer, 8192)
    asked = prompt.segments([Turn("user", "What does deep return?")])
    assert [t for s in asked[:len(layout_b)] for t in s.token_ids] == ids_b
