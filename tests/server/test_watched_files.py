"""`workspace/didChangeWatchedFiles` feeds the context: created, changed and deleted files."""
from __future__ import annotations

from lsprotocol import types

from tests.server.harness import command


def file_event(path, kind: types.FileChangeType) -> types.FileEvent:
    return types.FileEvent(uri=path.as_uri(), type=kind)


async def context_rows(client) -> dict[str, dict]:
    """The last file segment of each path (an edited file's current text is in the hot tail)."""
    rows = (await command(client, "codectx.showContext"))["segments"]
    return {row["key"]: row for row in rows if row["kind"] in ("file", "hot")}


async def test_file_events_update_the_prefix(vscode_client):
    client = vscode_client
    before = await context_rows(client)
    assert {"util.py", "main.py"} <= set(before) and "extra.py" not in before

    extra = client.root / "extra.py"
    extra.write_text("def extra():\n    return 'Ünïcode'\n", encoding="utf-8")
    main = client.root / "main.py"
    main.write_text(main.read_text(encoding="utf-8") + "\n\ndef more():\n    return main()\n", encoding="utf-8")
    (client.root / "util.py").unlink()
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
        file_event(extra, types.FileChangeType.Created), file_event(main, types.FileChangeType.Changed),
        file_event(client.root / "util.py", types.FileChangeType.Deleted)]))

    after = await context_rows(client)
    assert "extra.py" in after
    # Gone, or (when the old copy keeps its place) followed by a note saying it was deleted.
    assert "util.py" not in after or "deleted" in after["util.py"]["reason"]
    assert after["main.py"]["tokens"] > before["main.py"]["tokens"]
    state = await command(client, "codectx.status")
    assert state["prefixVersion"] == 3
