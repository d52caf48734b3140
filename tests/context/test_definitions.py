"""The definition index resolves a name defined more than once in a file by the cursor's line."""
from __future__ import annotations

from pathlib import Path

from context.definitions import DefinitionIndex

SOURCE = '''class First:
    def get(self):
        return 1


class Second:
    def get(self):
        return 2

    def use(self):
        return self.get()
'''


def index_of(tmp_path: Path) -> tuple[DefinitionIndex, Path]:
    path = tmp_path / "twice.py"
    path.write_text(SOURCE, encoding="utf-8")
    return DefinitionIndex(lambda p: p.read_text(encoding="utf-8")), path


def test_the_definition_on_the_cursor_line_is_the_one_found(tmp_path):
    index, path = index_of(tmp_path)
    assert "return 2" in index.find("get", path, [], line=7).snippet
    assert "return 1" in index.find("get", path, [], line=2).snippet


def test_a_use_resolves_to_the_last_definition_above_it(tmp_path):
    index, path = index_of(tmp_path)
    assert "return 2" in index.find("get", path, [], line=11).snippet


def test_without_a_line_or_above_every_definition_the_first_is_found(tmp_path):
    index, path = index_of(tmp_path)
    assert "return 1" in index.find("get", path, []).snippet
    assert "return 1" in index.find("get", path, [], line=1).snippet
    assert index.find("missing", path, [], line=3) is None
