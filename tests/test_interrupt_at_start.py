"""Ctrl-C while `llmem` is still importing its CLI (its first ~0.1 s) stops it quietly."""

import sys

import pytest

from llmem import __main__ as entry


class InterruptedImport:
    """A meta-path finder that is interrupted when asked for `llmem.cli`, as a Ctrl-C lands
    while click's modules load."""

    def find_spec(self, name, path=None, target=None):
        if name == "llmem.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_the_cli_loads_exits_130_without_a_traceback(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "llmem.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as stopped:
        entry.main(["list"])
    assert stopped.value.code == 130
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
