"""Edit a JSON or JSONC file the user owns, in place, changing only the members llmem adds.

The agents' config files (Claude Code's settings.json and ~/.claude.json, opencode.jsonc,
Copilot's mcp-config.json, Codex's hooks.json) are the user's: a rewrite through `json.dumps`
would drop their comments and trailing commas and reflow every inline array. json-five's
model loader keeps every byte that is not data (whitespace, comments, trailing commas) on
the nodes, so an edit here touches one member and dumping gives back the rest unchanged.

Adding a member and removing it again gives back the original bytes: the whitespace that
closed the container before the addition is moved onto the new member, and moved back on
removal. Containers that a removal leaves empty are removed too (see `remove_member`).

json-five's parser is pure Python (about 4 s per MB), and Claude Code's ~/.claude.json can
run to megabytes. A file that is exactly what `json.dumps` writes for its data (Claude Code
and Copilot write theirs with JSON.stringify(…, null, 2), which is the same text) is edited
as plain data instead, in milliseconds, with the same result: `load_document` picks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from json5 import model as m
from json5.dumper import ModelDumper
from json5.dumper import dumps as _dump_model
from json5.loader import ModelLoader
from json5.loader import loads as _load_model
from json5.utils import JSON5DecodeError

KeyPath = tuple[str | int, ...]
Keep = Callable[[KeyPath], bool]


class JsonSyntaxError(ValueError):
    """The text is not JSON (nor JSONC/JSON5): the message says where."""


def _parse(text: str) -> m.JSONText:
    try:
        return _load_model(text, loader=ModelLoader())
    except JSON5DecodeError as exc:
        # json-five lists every error it met; the first line names the place.
        first = str(exc).splitlines()
        detail = next((line.strip() for line in first if "line" in line and "column" in line),
                      first[0] if first else "not JSON")
        raise JsonSyntaxError(detail) from None
    except RecursionError:
        raise JsonSyntaxError("nested too deeply") from None


def _key_name(key: m.Key) -> str:
    return key.name if isinstance(key, m.Identifier) else key.characters


def plain(node: m.Node) -> Any:
    """The Python value of a model node (what json.loads would give for the same text)."""
    if isinstance(node, m.JSONText):
        return plain(node.value)
    if isinstance(node, m.JSONObject):
        return {_key_name(k): plain(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, m.JSONArray):
        return [plain(v) for v in node.values]
    if isinstance(node, m.String):
        return node.characters
    if isinstance(node, m.UnaryOp):
        value = plain(node.value)
        return -value if node.op == "-" else value
    if isinstance(node, m.Infinity):
        return float("-inf") if node.negative else float("inf")
    if isinstance(node, m.NaN):
        return float("nan")
    if isinstance(node, m.NullLiteral):
        return None
    return node.value  # Integer, Float, BooleanLiteral


def _split_tail(wsc: list) -> tuple[list, list]:
    """(comments and what precedes them, the final run of whitespace) of a wsc list."""
    if wsc and isinstance(wsc[-1], str):
        return list(wsc[:-1]), [wsc[-1]]
    return list(wsc), []


def _has_comment(wsc: list) -> bool:
    return any(isinstance(item, m.Comment) for item in wsc)


def _holds(container: Any, key: str | int) -> bool:
    """Whether `container` (an object or an array of plain data) has the member `key`."""
    if isinstance(container, dict):
        return isinstance(key, str) and key in container
    if isinstance(container, list):
        return isinstance(key, int) and 0 <= key < len(container)
    return False


# No agent writes a config nested this deep; past it, both parsers would recurse for tens of
# seconds before giving up (a 100k-deep file took over a minute under load).
MAX_DEPTH = 256
_NESTING_TOKENS = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/|[\[\]{}]', re.S)


def _nesting_depth(text: str) -> int:
    """How deep the containers of `text` nest (strings and comments skipped), counted
    only as far as MAX_DEPTH + 1."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    for token in _NESTING_TOKENS.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
        elif char in "]}":
            depth -= 1
    return deepest


def load_document(text: str) -> JsonDocument | PlainJsonDocument:
    """The document for `text`: plain data when json.dumps gives the text back, else the model."""
    plain = PlainJsonDocument.of(text)  # the stdlib parser gives up on deep nesting at once
    if plain is not None:
        return plain
    if _nesting_depth(text) > MAX_DEPTH:
        raise JsonSyntaxError("nested too deeply")
    return JsonDocument(text)


def _dumps(data: Any, indent: int | str | None) -> str:
    """json.dumps as JSON.stringify writes it: with `indent`, or compact on one line."""
    if indent is None:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(data, indent=indent, ensure_ascii=False)


def new_document(data: dict) -> PlainJsonDocument:
    return PlainJsonDocument(data, 2, "\n")


class PlainJsonDocument:
    """A JSON text that json.dumps(data, indent=…) writes back byte for byte, edited as data.

    The shapes tried are the ones the agents write: JSON.stringify(…, null, 2) (and 4 or a
    tab), and JSON.stringify(…) on one line (Claude Code's ~/.claude.json can be that, at
    megabytes); CRLF line ends are kept as they were."""

    def __init__(self, data: dict, indent: int | str | None, end: str, newline: str = "\n"):
        self._data, self._indent, self._end, self._newline = data, indent, end, newline

    @classmethod
    def of(cls, text: str) -> PlainJsonDocument | None:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        newline = "\n"
        if "\r\n" in text and "\n" not in text.replace("\r\n", ""):
            newline, text = "\r\n", text.replace("\r\n", "\n")
        body = text.rstrip("\n")
        end = text[len(body):]
        # One candidate, read off the text: json.dumps with an indent runs in pure Python
        # (about 0.25 s per MB), so trying every indent on a large file would cost seconds.
        if "\n" not in body:
            indent: int | str | None = None
        else:
            second = body.split("\n", 2)[1]
            lead = second[: len(second) - len(second.lstrip(" \t"))]
            indent = "\t" if lead == "\t" else len(lead) if lead in ("  ", "    ") else None
            if indent is None:
                return None
        return cls(data, indent, end, newline) if _dumps(data, indent) == body else None

    @property
    def data(self) -> dict:
        return self._data

    def text(self) -> str:
        return (_dumps(self._data, self._indent) + self._end).replace("\n", self._newline)

    def get(self, path: KeyPath) -> Any:
        node: Any = self._data
        for step in path:
            if not _holds(node, step):
                return None
            node = node[step]
        return node

    def set_member(self, path: KeyPath, key: str, value: Any) -> None:
        node = self._data
        for i, step in enumerate(path):
            node = node.setdefault(step, {})
            if not isinstance(node, dict):
                raise JsonSyntaxError(f"'{'.'.join(map(str, path[: i + 1]))}' is not an object")
        node[key] = value

    def append_item(self, path: KeyPath, value: Any) -> None:
        array = self.get(path)
        if array is None:
            self.set_member(path[:-1], str(path[-1]), [value])
        elif not isinstance(array, list):
            raise JsonSyntaxError(f"'{'.'.join(map(str, path))}' is not an array")
        else:
            array.append(value)

    def remove_member(self, path: KeyPath, key: str | int, keep: Keep | None = None) -> bool:
        container = self.get(path)
        if not _holds(container, key):
            return False
        del container[key]
        if not container and path and not (keep and keep(path)):
            self.remove_member(path[:-1], path[-1], keep)
        return True


class JsonDocument:
    """One JSON/JSONC text as json-five's model, and edits that keep everything else as it was."""

    def __init__(self, text: str):
        self._root = _parse(text)
        if not isinstance(self._root.value, m.JSONObject):
            raise JsonSyntaxError("the top level is not an object")
        self._unit = self._detect_unit()

    @property
    def data(self) -> dict:
        return plain(self._root)

    def text(self) -> str:
        return _dump_model(self._root, dumper=ModelDumper())

    # ---- finding nodes ------------------------------------------------------------------

    def _detect_unit(self) -> str:
        """The file's indentation step: the indent of the top level's first member (2 spaces
        when the file is on one line or empty)."""
        top = self._root.value
        lead = top.leading_wsc
        if lead and isinstance(lead[-1], str) and "\n" in lead[-1]:
            indent = lead[-1].rsplit("\n", 1)[1]
            if indent:
                return indent
        return "  "

    def _node(self, path: KeyPath) -> m.Value | None:
        node = self._root.value
        for step in path:
            if isinstance(node, m.JSONObject) and isinstance(step, str):
                index = self._index(node, step)
                if index is None:
                    return None
                node = node.values[index]
            elif isinstance(node, m.JSONArray) and isinstance(step, int) and 0 <= step < len(node.values):
                node = node.values[step]
            else:
                return None
        return node

    @staticmethod
    def _index(obj: m.JSONObject, key: str) -> int | None:
        # The last of duplicate keys is the one JSON readers keep.
        found = None
        for i, k in enumerate(obj.keys):
            if _key_name(k) == key:
                found = i
        return found

    def get(self, path: KeyPath) -> Any:
        node = self._node(path)
        return None if node is None else plain(node)

    # ---- rendering new values -----------------------------------------------------------

    def _separator(self, container: m.JSONObject | m.JSONArray, depth: int) -> str:
        """The whitespace before a new member: what its siblings have, else one line per member."""
        leads = container.keys if isinstance(container, m.JSONObject) else container.values
        if len(leads) >= 2:
            _, tail = _split_tail(leads[-1].wsc_before)
        else:
            _, tail = _split_tail(container.leading_wsc)
        if leads and tail:
            return tail[0]
        if leads and not tail:
            return " " if isinstance(container, m.JSONObject) else ""
        return "\n" + self._unit * (depth + 1)

    def _render(self, value: Any, separator: str) -> str:
        if "\n" not in separator:
            return json.dumps(value, ensure_ascii=False)
        indent = separator.rsplit("\n", 1)[1]
        text = json.dumps(value, indent=self._unit, ensure_ascii=False)
        return text.replace("\n", "\n" + indent)

    def _new_pair(self, key: str, value: Any, separator: str) -> tuple[m.Key, m.Value]:
        source = "{" + json.dumps(key, ensure_ascii=False) + ": " + self._render(value, separator) + "}"
        obj = _parse(source).value
        return obj.keys[0], obj.values[0]

    def _new_item(self, value: Any, separator: str) -> m.Value:
        return _parse("[" + self._render(value, separator) + "]").value.values[0]

    # ---- edits --------------------------------------------------------------------------

    def _append(self, container, lead: m.Node, tail: m.Value, depth: int, separator: str) -> None:
        """Put a new member (key node `lead` and value `tail`; for arrays both the item) last."""
        leads = container.keys if isinstance(container, m.JSONObject) else container.values
        if leads:
            last = container.values[-1]
            if container.trailing_comma is not None:
                # A comment after the trailing comma belongs to the member before it; the
                # closing whitespace stays after the comma.
                head, closing = _split_tail(container.trailing_comma.wsc_after)
                container.trailing_comma.wsc_after = closing
                lead.wsc_before = head + [separator]
                tail.wsc_after = []
            else:
                head, closing = _split_tail(last.wsc_after)
                last.wsc_after = []
                lead.wsc_before = head + [separator]
                tail.wsc_after = closing
        else:
            head, _ = _split_tail(container.leading_wsc)
            container.leading_wsc = head + [separator]
            lead.wsc_before = []
            tail.wsc_after = ["\n" + self._unit * depth] if "\n" in separator else []
        if isinstance(container, m.JSONObject):
            container.keys.append(lead)
            container.values.append(tail)
        else:
            container.values.append(tail)

    def set_member(self, path: KeyPath, key: str, value: Any) -> None:
        """Set `key` of the object at `path` (created with its parents when missing).

        An existing member keeps its place and the whitespace around it; a new one goes last.
        """
        node = self._root.value
        depth = 0
        for i, step in enumerate(path):
            child = self._node(path[: i + 1])
            if child is None:
                # Build {path[i+1]: {…: {key: value}}} and add it under path[i] in one piece.
                nested: Any = {key: value}
                for outer in reversed(path[i + 1:]):
                    nested = {outer: nested}
                self._add_pair(node, str(step), nested, depth)
                return
            if not isinstance(child, m.JSONObject):
                raise JsonSyntaxError(f"'{'.'.join(map(str, path[: i + 1]))}' is not an object")
            node, depth = child, depth + 1
        index = self._index(node, key)
        if index is None:
            self._add_pair(node, key, value, depth)
            return
        separator = self._member_separator(node, index, depth)
        old = node.values[index]
        new = self._new_pair(key, value, separator)[1]
        new.wsc_before, new.wsc_after = old.wsc_before, old.wsc_after
        node.values[index] = new

    def _member_separator(self, obj: m.JSONObject, index: int, depth: int) -> str:
        wsc = obj.leading_wsc if index == 0 else obj.keys[index].wsc_before
        _, tail = _split_tail(wsc)
        return tail[0] if tail else self._separator(obj, depth)

    def _add_pair(self, obj: m.JSONObject, key: str, value: Any, depth: int) -> None:
        separator = self._separator(obj, depth)
        lead, tail = self._new_pair(key, value, separator)
        self._append(obj, lead, tail, depth, separator)

    def append_item(self, path: KeyPath, value: Any) -> None:
        """Append `value` to the array at `path`, or make `path`'s last key a one-item array."""
        array = self._node(path)
        if array is None:
            self.set_member(path[:-1], str(path[-1]), [value])
            return
        if not isinstance(array, m.JSONArray):
            raise JsonSyntaxError(f"'{'.'.join(map(str, path))}' is not an array")
        separator = self._separator(array, len(path))
        item = self._new_item(value, separator)
        self._append(array, item, item, len(path), separator)

    def remove_member(self, path: KeyPath, key: str | int, keep: Keep | None = None) -> bool:
        """Remove a key of the object (or an index of the array) at `path`; False if absent.

        A container this leaves empty is removed from its own parent in turn (the top level
        stays): what llmem created to hold its member goes with it. `keep(path)` says which
        containers were there before llmem (a user's `"hooks": {}`): those stay, empty.
        """
        container = self._node(path)
        if isinstance(container, m.JSONObject) and isinstance(key, str):
            index = self._index(container, key)
            if index is None:
                return False
            leads = container.keys
        elif isinstance(container, m.JSONArray) and isinstance(key, int) and 0 <= key < len(container.values):
            index, leads = key, container.values
        else:
            return False
        lead, tail = leads[index], container.values[index]
        count = len(container.values)
        if count == 1:
            if not _has_comment(container.leading_wsc):
                container.leading_wsc = []
            container.trailing_comma = None
        elif index == count - 1:
            previous = container.values[index - 1]
            head, _ = _split_tail(lead.wsc_before)
            if container.trailing_comma is not None:
                container.trailing_comma.wsc_after = head + container.trailing_comma.wsc_after
            else:
                previous.wsc_after = previous.wsc_after + head + tail.wsc_after
        else:
            following = leads[index + 1]
            if index == 0:
                carried = tail.wsc_after + following.wsc_before
                following.wsc_before = carried if _has_comment(carried) else []
            else:
                head, _ = _split_tail(lead.wsc_before)
                following.wsc_before = head + following.wsc_before
        if isinstance(container, m.JSONObject):
            del container.keys[index]
        del container.values[index]
        if not container.values and path and not (keep and keep(path)):
            self.remove_member(path[:-1], path[-1], keep)
        return True
