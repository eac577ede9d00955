"""Log lines for people or for machines (`--log-format json`).

A JSON line is one object: time, level, logger, message, and the pass, task and trainer the
line concerns when the code that logged it said so (`extra=about(...)`), so a log pipeline can
follow one task or one trainer without parsing sentences.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

FIELDS = ("pass_id", "task", "epoch", "trainer", "session", "reason")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def about(**fields: Any) -> dict[str, Any]:
    """The `extra=` of a log call: what the line concerns (pass_id, task, trainer, ...)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log fields {sorted(unknown)}")
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup(level: int, fmt: str = "text") -> None:
    """Configure the root logger: `text` for people, `json` for machines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
