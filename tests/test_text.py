"""The bottom layer's one-line text helpers, the shown times and the UTF-8 decode that names
the bad byte: each written once, every caller goes through it."""

import pytest

from llmem.errors import ConfigError, LlmemError, UsageError
from llmem.paths import decode_utf8
from llmem.text import error_line, one_line
from llmem.times import file_stamp, utc_date, utc_minute, utc_second


def test_one_line_folds_whitespace_and_cuts_with_an_ellipsis():
    assert one_line("  a\n\tb   c \r\n") == "a b c"
    assert one_line(None) == ""
    assert one_line("abcdef", 6) == "abcdef"
    assert one_line("abcdefg", 6) == "abcde…" and len(one_line("x" * 500, 80)) == 80


def test_error_line_says_an_llmem_error_by_its_message_and_others_by_their_class():
    error = UsageError("bad\n value", hint="fix it")
    assert error_line(error) == "bad value"
    assert error_line(error, hint=True) == "bad value (hint: fix it)"
    assert error_line(LlmemError("no hint"), hint=True) == "no hint"
    assert error_line(ValueError("ragged\nvectors")) == "ValueError: ragged vectors"
    assert error_line(KeyError()) == "KeyError"
    assert error_line(RuntimeError("x" * 400), 50).endswith("…")


def test_times_are_shown_in_utc():
    stamp = 1_764_610_455.0  # 2025-12-01 17:34:15 UTC
    assert utc_minute(stamp) == "2025-12-01 17:34 UTC"
    assert utc_second(stamp) == "2025-12-01 17:34:15 UTC"
    assert utc_date(stamp) == "2025-12-01"
    assert len(file_stamp(stamp)) == 15 and file_stamp(stamp)[8] == "T"


def test_decode_utf8_names_the_bad_byte_and_its_offset():
    assert decode_utf8("é".encode(), "f", hint="h") == "é"
    with pytest.raises(UsageError) as caught:
        decode_utf8(b"ab\xff", "notes.json", hint="save it as UTF-8")
    assert caught.value.message == "cannot read notes.json: not UTF-8 text (byte 0xff at offset 2)"
    assert caught.value.hint == "save it as UTF-8"
    assert not isinstance(caught.value, ConfigError)


def test_atomic_file_keeps_the_old_file_and_no_temp_when_the_writer_fails(tmp_path):
    from llmem.paths import atomic_file, write_atomically

    target = tmp_path / "notes.bin"
    write_atomically(target, "old")
    with pytest.raises(RuntimeError), atomic_file(target, binary=True, sync_folder=True) as out:
        out.write(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.bin"]
    with atomic_file(target, 0o644, binary=True, sync_folder=True) as out:
        out.write(b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o644
