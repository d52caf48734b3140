"""docs/configuration.md's settings table is the server's settings tree: names, types, defaults."""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

from server.core.settings import Settings, parse_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", tuple[str, ...]: "list of strings"}


def _camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def settings_tree(cls: type = Settings, prefix: str = "") -> dict[str, tuple[str, object]]:
    """camelCase setting path -> (type name, default), from the dataclasses."""
    hints, defaults, out = typing.get_type_hints(cls), cls(), {}
    for field in dataclasses.fields(cls):
        kind, name = hints[field.name], prefix + _camel(field.name)
        if dataclasses.is_dataclass(kind):
            out.update(settings_tree(kind, name + "."))
        else:
            value = getattr(defaults, field.name)
            out[name] = (TYPES[kind], list(value) if isinstance(value, tuple) else value)
    return out


def documented() -> dict[str, tuple[str, object]]:
    """The rows of the table under "## Settings"."""
    section = DOC.read_text(encoding="utf-8").split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\|\s*`([\w.]+)`\s*\|\s*([\w ]+?)\s*\|\s*`(.*?)`\s*\|", line)
        if found:
            name, kind, default = found.groups()
            assert name not in rows, f"{name} documented twice"
            rows[name] = (kind, json.loads(default))
    return rows


def test_every_setting_is_documented_with_its_type_and_default():
    assert documented() == settings_tree()


def test_documented_defaults_parse_back_to_the_defaults():
    """Each documented default, sent by a client, is accepted as it is and gives the default."""
    for name, (_, default) in documented().items():
        *sections, leaf = name.split(".")
        raw: dict = {}
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = default
        settings, problems = parse_settings(raw)
        assert problems == [], (name, problems)
        assert settings == Settings(), name
