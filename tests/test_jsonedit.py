"""setup/jsonedit.py: one member added or removed, every other byte of the user's JSON/JSONC
kept, and an addition followed by its removal giving back the original text."""

from __future__ import annotations

import json

import pytest

from llmem.setup.jsonedit import JsonDocument, JsonSyntaxError, PlainJsonDocument, load_document

ENTRY = {"type": "local", "command": ["/opt/llmem", "mcp"]}

TEXTS = {
    "two-space": '{\n  "a": 1,\n  "mcp": {\n    "x": {"type": "local"}\n  }\n}\n',
    "four-space": '{\n    "a": 1\n}',
    "tabs": '{\n\t"a": [1, 2],\n\t"b": {}\n}\n',
    "one line": '{"a": 1, "mcp": {"x": 2}}',
    "empty": "{}",
    "comments": '// head\n{\n  "a": 1, // after a\n  /* before mcp */\n  "mcp": {\n    "x": 1 // after x\n  }\n}\n',
    "trailing commas": '{\n  "a": [1, 2,],\n  "mcp": {\n    "x": 1,\n  },\n}\n',
    "comment in empty": '{\n  "mcp": { /* none yet */ }\n}\n',
    "as json.dumps writes it": json.dumps({"a": "é", "mcp": {"x": [1, {}]}, "n": None}, indent=2) + "\n",
}


@pytest.mark.parametrize("name", list(TEXTS))
@pytest.mark.parametrize("load", [JsonDocument, load_document])
def test_add_then_remove_gives_back_the_text(name, load):
    text = TEXTS[name]
    doc = load(text)
    doc.set_member(("mcp",), "llmem", ENTRY)
    added = doc.text()
    import json5

    data = json5.loads(added)
    assert data["mcp"]["llmem"] == ENTRY
    assert {k: v for k, v in data.items() if k != "mcp"} == {k: v for k, v in json5.loads(text).items() if k != "mcp"}
    again = load(added)
    assert again.remove_member(("mcp",), "llmem")
    if name in ("empty", "comment in empty"):
        # The `mcp` llmem created (or found empty) goes with its last member.
        assert "llmem" not in again.text()
    else:
        assert again.text() == text


def test_new_members_follow_the_files_style():
    doc = JsonDocument(TEXTS["tabs"])
    doc.set_member(("mcp",), "llmem", {"k": [1]})
    assert '\n\t"mcp": {\n\t\t"llmem": {\n\t\t\t"k": [\n\t\t\t\t1\n\t\t\t]\n\t\t}\n\t}\n}' in doc.text()
    doc = JsonDocument(TEXTS["one line"])
    doc.set_member(("mcp",), "llmem", {"k": 1})
    assert doc.text() == '{"a": 1, "mcp": {"x": 2, "llmem": {"k": 1}}}'


def test_a_comment_after_the_last_member_stays_with_it():
    doc = JsonDocument(TEXTS["comments"])
    doc.set_member(("mcp",), "llmem", {"k": 1})
    assert '"x": 1, // after x\n    "llmem": {\n      "k": 1\n    }\n  }' in doc.text()


def test_replacing_a_member_keeps_its_place():
    doc = JsonDocument('{\n  "mcp": {\n    "llmem": {"old": true}, // mine\n    "z": 1\n  }\n}\n')
    doc.set_member(("mcp",), "llmem", {"new": 1})
    assert doc.text() == '{\n  "mcp": {\n    "llmem": {\n      "new": 1\n    }, // mine\n    "z": 1\n  }\n}\n'


def test_removing_the_first_or_a_middle_member():
    doc = JsonDocument('{\n  "a": 1,\n  "b": 2,\n  "c": 3\n}\n')
    doc.remove_member((), "b")
    assert doc.text() == '{\n  "a": 1,\n  "c": 3\n}\n'
    doc.remove_member((), "a")
    assert doc.text() == '{\n  "c": 3\n}\n'
    assert not doc.remove_member((), "missing") and not doc.remove_member(("c",), "x")


def test_arrays_of_hook_groups():
    text = '{\n  "hooks": {\n    "Stop": [\n      {"hooks": []}\n    ]\n  }\n}\n'
    doc = JsonDocument(text)
    doc.append_item(("hooks", "Stop"), {"hooks": [{"command": "x"}]})
    doc.append_item(("hooks", "SessionEnd"), {"hooks": [{"command": "y"}]})
    data = json.loads(doc.text())
    assert data["hooks"]["Stop"][1] == {"hooks": [{"command": "x"}]}
    assert data["hooks"]["SessionEnd"] == [{"hooks": [{"command": "y"}]}]
    doc.remove_member(("hooks", "SessionEnd", 0, "hooks"), 0)  # empties its way up to the event
    doc.remove_member(("hooks", "Stop"), 1)
    assert doc.text() == text


@pytest.mark.parametrize("text", ['{"a": }', "[1, 2]", "", '{"a": 1} trailing'])
def test_what_is_not_a_json_object_is_refused(text):
    with pytest.raises(JsonSyntaxError):
        JsonDocument(text)


@pytest.mark.slow  # a whole run of real processes: 2-5 s
def test_a_large_file_as_json_dumps_writes_it_is_edited_as_data():
    """~/.claude.json can run to megabytes; json-five's parser takes seconds per MB."""
    import time

    data = {"projects": {f"/home/dev/p{i}": {"history": [{"display": "x" * 80}] * 50} for i in range(200)}}
    text = json.dumps(data, indent=2)  # ≈ 1.5 MB, the shape Claude Code writes
    started = time.process_time()  # CPU: the machine's load is not the edit's cost
    doc = load_document(text)
    doc.set_member(("mcpServers",), "llmem", ENTRY)
    added = doc.text()
    assert isinstance(doc, PlainJsonDocument) and time.process_time() - started < 2
    assert added.startswith(text[:-2]) and json.loads(added)["mcpServers"]["llmem"] == ENTRY
    again = load_document(added)
    again.remove_member(("mcpServers",), "llmem")
    assert again.text() == text
    assert not isinstance(load_document(text.replace("{", "{ ", 1)), PlainJsonDocument)
