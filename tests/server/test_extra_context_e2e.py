"""The extra context of other files end to end: the real `dfim serve` over stdio, a project on disk as the
workspace folder; what the model read comes back in `dfim/lastTrace`'s `prefix`."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.server_helpers import Session, random_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="module")

SETTINGS = {
    "sampling": {"maxSteps": 2, "maxCanvas": 32},
    "telemetry": {"enabled": False},
    "context": {"extra": {"enabled": True}},  # off by default (decision 75)
}
UTIL = '''def slugify(text: str, sep: str = "-") -> str:
    """Turn text into a URL slug."""
    return text.replace(" ", sep).lower()
'''
MAIN = "from pkg.util import slugify\n\n\ndef run(names):\n    return [\n"
NOTES = "".join(f"REMEMBER_{i} = {i}\n" for i in range(12))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("proj")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text(UTIL)
    s = Session()
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("ckpt"))
    await s.start(checkpoint, tmp_path_factory.mktemp("data"), init_options=SETTINGS, root_uri=root.as_uri())
    status = await s.wait_state()
    assert status.state == "ready", status
    yield s, root
    await s.stop()


async def prefix_read(session: Session, uri: str, line: int, character: int) -> str:
    before = (await session.stats()).engine_fills_completed
    await session.inline(uri, line, character)
    assert (await session.stats()).engine_fills_completed > before  # the model ran (no cached answer)
    trace = await session.client.protocol.send_request_async("dfim/lastTrace", {})
    return trace.prefix


async def test_the_server_asks_for_saves(project):
    session, _ = project
    sync = session.result.capabilities.text_document_sync
    assert sync.save is not None


async def test_imported_definitions_and_other_files_reach_the_model_and_go_when_turned_off(project):
    session, root = project
    notes_uri = (root / "notes.py").as_uri()
    session.open(notes_uri, NOTES)  # another open file: its chunk joins the ring
    uri = (root / "pkg" / "main.py").as_uri()
    session.open(uri, MAIN)
    prefix = await prefix_read(session, uri, 4, 12)
    assert prefix.startswith('# file: pkg/util.py\n# def slugify(text: str, sep: str = "-") -> str:\n')
    assert "# REMEMBER_0 = 0" in prefix and "# file: notes.py" in prefix
    assert prefix.endswith("# file: pkg/main.py\n" + MAIN[:-1])  # then the file, up to the cursor
    assert "return text.replace" not in prefix  # a definition, not its body

    session.configure({"context": {"extra": {"chunks": False}}})
    prefix = await prefix_read(session, uri, 4, 12)
    assert "slugify(text: str" in prefix and "REMEMBER_" not in prefix

    session.configure({"context": {"extra": {"enabled": False}}})
    prefix = await prefix_read(session, uri, 4, 12)
    assert not prefix.startswith("#") and "# file:" not in prefix and prefix.startswith(MAIN.split("\n")[0])

    session.configure({"context": {"extra": {"enabled": True, "chunks": True}}})
    # a save of the other file after an edit: the edited lines are what the ring holds for it
    session.change(
        notes_uri,
        "EDITED_LINE = 1\n",
        types.Range(start=types.Position(line=6, character=0), end=types.Position(line=6, character=0)),
    )
    session.client.text_document_did_save(
        types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=notes_uri))
    )
    prefix = await prefix_read(session, uri, 4, 12)
    assert "# EDITED_LINE = 1" in prefix and prefix.count("# file: notes.py") == 1
