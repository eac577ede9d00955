"""Log lines for people or for machines (`--log-format json`).

A JSON line is one object: time, level, logger, message, and the pass, task and trainer the
line concerns when the code that logged it said so (`extra=about(...)`), so a log pipeline can
follow one task or one trainer without parsing sentences.

What trainers send (names, hosts, failure reasons, globs) reaches the log: control characters
in a message are escaped (`printable`), so a name cannot forge log lines or drive the
terminal that shows them. A line repeated faster than `RepeatLimit` allows (a flood of refused
calls) is held back, and the next one let through says how many were.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

FIELDS = ("pass_id", "task", "epoch", "trainer", "session", "reason")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: C0 and C1 controls, DEL, and the invisible format characters that reorder or hide text
#: (bidirectional overrides, zero-width characters, the byte-order mark).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control character escaped as Python would write it (a newline as
    `\\n`, ESC as `\\x1b`): one line, shown as sent, without effect on a terminal."""
    return _CONTROL.sub(_escape, text)


def plural(n: int, word: str, words: str | None = None) -> str:
    """`n` and the word in the form `n` asks for: "1 task", "2 tasks", "0 tasks" (`words`
    for a plural that is not the word with an s). Counts shown to people read as sentences,
    never "1 task(s)"."""
    return f"{n} {word if n == 1 else words or word + 's'}"


def about(**fields: Any) -> dict[str, Any]:
    """The `extra=` of a log call: what the line concerns (pass_id, task, trainer, ...)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log fields {sorted(unknown)}")
    return fields


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, the message's control characters escaped (a traceback stays as it is)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": printable(record.getMessage()),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = printable(value) if isinstance(value, str) else value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


@dataclass
class _Kind:
    since: float  # when its window began (time.monotonic())
    passed: int = 0  # lines let through in the window
    held: int = 0  # lines held back in the window


class RepeatLimit(logging.Filter):
    """At most `burst` lines of one kind (logger, level, message template) every `window`
    seconds; the last one let through says that more are held back, and the first one of a
    later window how many were. Debug lines pass: asking for them is asking for everything.
    Remembers at most `kinds` kinds (the oldest are forgotten first)."""

    def __init__(self, burst: int = 20, window: float = 10.0, kinds: int = 1024) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self.kinds = kinds
        self._seen: dict[tuple[str, int, str], _Kind] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = time.monotonic()
        note = ""
        with self._lock:
            kind = self._seen.get(key)
            if kind is None or now - kind.since >= self.window:
                if kind is not None and kind.held:
                    note = f" [{kind.held} more like this were not logged]"
                kind = _Kind(now)
                self._seen.pop(key, None)
                self._seen[key] = kind
                while len(self._seen) > self.kinds:
                    del self._seen[next(iter(self._seen))]
            if kind.passed >= self.burst:
                kind.held += 1
                return False
            kind.passed += 1
            if kind.passed == self.burst:
                note += f" [more like this are held back for up to {self.window:.0f}s]"
        if note:
            record.msg = f"{record.getMessage()}{note}"
            record.args = None
        return True


def setup(level: int, fmt: str = "text") -> None:
    """Configure the root logger: `text` for people, `json` for machines; repeated lines
    limited (RepeatLimit)."""
    handler = _Ours()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RepeatLimit())
    root = logging.getLogger()
    # an earlier setup's handler is replaced; handlers others installed (a host program's,
    # pytest's capture) stay
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _Ours)] + [handler]
    root.setLevel(level)


class _Ours(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `setup` installs, told apart from handlers it must leave alone."""
