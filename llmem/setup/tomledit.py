"""Edit Codex's config.toml: llmem's `notify` line and its `[mcp_servers.llmem]` table, as text.

tomlkit re-lays a document when a table is added to one whose keys are dotted
(`mcp_servers.github.command = "gh-mcp"` at the top level): the top-level keys after the
dotted one (`approval_policy`, llmem's own `notify`) came back inside `[mcp_servers.llmem]`.
So the two things llmem adds are written as text where TOML keeps them unambiguous, a
`notify = […]` line among the top-level keys (before the first table) and a
`[mcp_servers.llmem]` table at the end of the file, and removed as the same text, which gives
back the user's bytes. Every edit is checked by parsing the result with tomllib: it must hold
the user's data unchanged plus (or minus) llmem's, or the edit is refused (TomlEditError) and
nothing is written. Only `mcp_servers = { … }` (an inline table, which a header cannot
extend) is edited through tomlkit, checked the same way.
"""

from __future__ import annotations

import copy
import re
import tomllib
from typing import Any

SERVERS = "mcp_servers"
_INLINE_SERVERS = re.compile(r"^[ \t]*mcp_servers[ \t]*=", re.MULTILINE)


class TomlEditError(ValueError):
    """An edit would change more than llmem's own keys: the message says which."""


def _value(value: Any) -> str:
    import tomlkit

    return tomlkit.item(value).as_string()


def _key(key: str) -> str:
    import tomlkit

    return tomlkit.key(key).as_string()


def _without_empty_servers(data: dict) -> dict:
    if data.get(SERVERS) == {}:
        data = dict(data)
        del data[SERVERS]
    return data


class TomlDocument:
    """config.toml's text and data; `text` changes only through the checked edits below."""

    def __init__(self, text: str):
        self.text = text
        self.data = tomllib.loads(text)  # tomllib.TOMLDecodeError (a ValueError) when broken
        self.newline = "\r\n" if "\r\n" in text else "\n"

    # ---- checked replacement --------------------------------------------------------------

    def _accept(self, text: str, expected: dict, what: str) -> None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TomlEditError(f"{what} would make the file invalid TOML ({exc})") from None
        if _without_empty_servers(data) != _without_empty_servers(expected):
            raise TomlEditError(f"{what} would change other keys of the file")
        self.text, self.data = text, data

    # ---- notify -------------------------------------------------------------------------

    def _notify_line(self, argv: list[str]) -> str:
        return f"notify = {_value(argv)}{self.newline}"

    def _top_level_insertion(self) -> int:
        """Where a top-level key may go: after the leading comments, before the first key or
        table; before the comment block that sits right above a first table's header."""
        lines = self.text.splitlines(keepends=True)
        offset, block_start = 0, None
        for line in lines:
            stripped = line.strip()
            if not stripped:
                block_start = None
            elif stripped.startswith("#"):
                block_start = offset if block_start is None else block_start
            else:
                if stripped.startswith("[") and block_start is not None:
                    return block_start
                return offset
            offset += len(line)
        return offset

    def set_notify(self, argv: list[str]) -> None:
        if "notify" in self.data:
            self.remove_notify()
        at = self._top_level_insertion()
        text = self.text
        if at == len(text) and text and not text.endswith("\n"):
            text += self.newline
            at = len(text)
        expected = {**self.data, "notify": argv}
        self._accept(text[:at] + self._notify_line(argv) + text[at:], expected, "adding `notify`")

    def remove_notify(self) -> None:
        expected = {k: v for k, v in self.data.items() if k != "notify"}
        line = self._notify_line(self.data["notify"]) if isinstance(self.data.get("notify"), list) else None
        start = self.text.find(line) if line else -1
        if start == 0 or (start > 0 and self.text[start - 1] == "\n"):
            self._accept(self.text[:start] + self.text[start + len(line):], expected, "removing `notify`")
            return
        import tomlkit

        doc = tomlkit.parse(self.text)
        del doc["notify"]
        self._accept(tomlkit.dumps(doc), expected, "removing `notify`")

    # ---- the MCP server -----------------------------------------------------------------

    def _block(self, name: str, entry: dict) -> str:
        """The entry as a table; a table value (`env`) as its own `[mcp_servers.<name>.env]`
        after it, the shape `codex mcp add --env` writes."""
        nl = self.newline

        def table(header: str, values: dict) -> str:
            keys = "".join(f"{_key(key)} = {_value(value)}{nl}" for key, value in values.items()
                           if not isinstance(value, dict))
            subtables = "".join(nl + table(f"{header}.{_key(key)}", value) for key, value in values.items()
                                if isinstance(value, dict))
            return f"[{header}]{nl}{keys}{subtables}"

        return table(f"{SERVERS}.{name}", entry)

    def add_server(self, name: str, entry: dict) -> None:
        servers = self.data.get(SERVERS)
        if servers is not None and not isinstance(servers, dict):
            raise TomlEditError(f"'{SERVERS}' is not a table")
        expected = copy.deepcopy(self.data)
        expected.setdefault(SERVERS, {})[name] = entry
        if _INLINE_SERVERS.search(self.text):  # `mcp_servers = { … }`: a header cannot extend it
            import tomlkit

            doc = tomlkit.parse(self.text)
            table = tomlkit.inline_table()
            table.update(entry)
            doc[SERVERS][name] = table
            self._accept(tomlkit.dumps(doc), expected, f"adding `{SERVERS}.{name}`")
            return
        text = self.text
        if text and not text.endswith("\n"):
            text += self.newline
        if text.strip():
            text += self.newline  # a blank line between the user's last table and llmem's
        self._accept(text + self._block(name, entry), expected, f"adding `[{SERVERS}.{name}]`")

    def remove_server(self, name: str) -> None:
        expected = copy.deepcopy(self.data)
        del expected[SERVERS][name]
        entry = self.data[SERVERS][name]
        block = self._block(name, entry)
        for piece in (self.newline + block, block):
            start = self.text.find(piece)
            if start >= 0 and (start == 0 or self.text[start - 1] == "\n" or piece[0] in "\r\n"):
                try:
                    self._accept(self.text[:start] + self.text[start + len(piece):], expected,
                                 f"removing `[{SERVERS}.{name}]`")
                    return
                except TomlEditError:
                    break
        import tomlkit

        doc = tomlkit.parse(self.text)
        del doc[SERVERS][name]
        if not doc[SERVERS]:
            del doc[SERVERS]
        self._accept(tomlkit.dumps(doc), expected, f"removing `{SERVERS}.{name}`")
