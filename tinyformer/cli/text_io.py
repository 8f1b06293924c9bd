"""Text in and out of the commands: input lines read as UTF-8 (undecodable bytes and NUL characters
become U+FFFD, with a warning), output written as UTF-8, warnings on stderr."""

import re
import sys
from pathlib import Path

# Bytes that are not UTF-8 (escaped to lone surrogates by "surrogateescape") and NUL characters.
_UNREADABLE = re.compile("[\udc80-\udcff\x00]")


def plural(count, word):
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def split_lines(data):
    """(lines, replaced, line numbers) of raw bytes: lines end at b"\\n" (a final one ends the last
    line; a "\\r" before it is dropped); bytes that are not UTF-8 and NUL characters become U+FFFD,
    ``replaced`` of them on the lines numbered (from 1) in the third item."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    lines, replaced, where = [], 0, []
    for number, raw in enumerate(parts, 1):
        text, count = _UNREADABLE.subn("\ufffd", raw.removesuffix(b"\r").decode("utf-8", "surrogateescape"))
        if count:
            replaced += count
            where.append(number)
        lines.append(text)
    return lines, replaced, where


def read_lines(path, what, command):
    """The lines of a file (or stdin for None or "-"), warning on stderr about replaced bytes."""
    if path in (None, "-"):
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        path = "<stdin>"
    else:
        data = Path(path).read_bytes()
    lines, replaced, where = split_lines(data)
    if replaced:
        from ..translation.prediction import line_list

        warn(command, f"{what} {path}: replaced {plural(replaced, 'undecodable byte')} / NUL characters by U+FFFD "
             f"on {plural(len(where), 'line')} ({line_list(where)})")
    return lines


def warn(command, message):
    print(f"tinyformer {command}: warning: {message}", file=sys.stderr)


def write_text(text, path):
    """UTF-8 to a file (replaced whole: an interrupted write leaves the old one), or to stdout for None
    or "-" (whatever the locale's encoding)."""
    from ..common.atomic import write_atomically

    data = text.encode("utf-8")
    if path not in (None, "-"):
        target = Path(path)
        if target.exists() and not target.is_file():  # /dev/stdout, a pipe: written, never replaced
            target.write_bytes(data)
        else:
            write_atomically(target, data)
        return
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    buffer.write(data)
    buffer.flush()
