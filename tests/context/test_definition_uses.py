"""The definition index counts the files that refer to a name and lists what a definition uses."""
from __future__ import annotations

from pathlib import Path

from context.definitions import DefinitionIndex, ReferenceCount
from tests.definition_sources import CALLS

LIB = CALLS + '''

class Box:
    def size(self):
        return 1

    def twice(self):
        return self.size() * 2
'''


def repo(tmp_path: Path) -> tuple[DefinitionIndex, list[Path], list[str]]:
    """lib.py defines the names; one.py and two.py call `helper`; three.py does not. The index
    records every read, so a test can see what a second count reads and parses."""
    texts = {"lib.py": LIB, "one.py": "from lib import helper\n\n\ndef f():\n    return helper(1)\n",
             "two.py": "import lib\n\n\ndef g():\n    return lib.helper(2) + helper(3)\n",
             "three.py": "def h():\n    return 3\n"}
    for name, text in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    reads: list[str] = []

    def read(path: Path) -> str:
        reads.append(path.name)
        return path.read_text(encoding="utf-8")

    return DefinitionIndex(read), [tmp_path / name for name in texts], reads


def test_a_name_called_from_two_files_counts_two_of_the_files_searched(tmp_path):
    index, files, _ = repo(tmp_path)
    assert index.references_count("helper", files) == ReferenceCount(files=2, searched=4)
    assert index.references_count("helper", [*files, files[1]]) == ReferenceCount(2, 4)  # each file once
    assert index.references_count("nowhere", files) == ReferenceCount(0, 4)


def test_the_count_follows_an_edit_and_parses_each_text_once(tmp_path):
    index, files, reads = repo(tmp_path)
    index.references_count("helper", files)
    parsed = dict(index._parsed)
    (tmp_path / "three.py").write_text("from lib import helper\n\n\ndef h():\n    return helper(3)\n",
                                       encoding="utf-8")
    reads.clear()
    assert index.references_count("helper", files) == ReferenceCount(3, 4)
    assert reads == ["lib.py", "one.py", "two.py", "three.py"]  # one read per file per count
    unchanged = [p for p in files if p.name != "three.py"]
    assert all(index._parsed[p][1] is parsed[p][1] for p in unchanged)  # the same tags, not parsed again
    assert index._parsed[files[3]][1] is not parsed[files[3]][1]


def test_a_file_that_cannot_be_read_is_not_counted_as_searched(tmp_path):
    index, files, _ = repo(tmp_path)
    files[2].unlink()
    assert index.references_count("helper", files) == ReferenceCount(1, 3)


def test_a_found_site_counts_over_the_files_it_was_searched_in(tmp_path):
    index, files, _ = repo(tmp_path)
    site = index.find("helper", files[1], files)
    assert site.reference_count == ReferenceCount(2, 4)
    assert index.find("helper", files[0], []).reference_count == ReferenceCount(0, 1)  # lib.py alone


def test_uses_lists_the_callees_first_named_first_without_itself_or_unknown_names(tmp_path):
    index, files, _ = repo(tmp_path)
    site = index.find("combine", files[0], files)
    used = index.uses(site, files)
    # zoom before scale (the order the text names them, not the alphabet); `combine` (itself)
    # and `missing` (defined nowhere) are left out.
    assert [u.definition.signature for u in used] == ["def zoom(a):", "def scale(v, k):"]


def test_uses_leaves_out_what_is_defined_inside_the_definition(tmp_path):
    index, files, _ = repo(tmp_path)
    box = index.find("Box", files[0], files)
    assert index.uses(box, files) == []  # `size` is quoted with the class already
    twice = index.find("twice", files[0], files)
    assert [u.definition.name for u in index.uses(twice, files)] == ["size"]
