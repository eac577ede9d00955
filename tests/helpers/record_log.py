"""The line log a chaos or soak trainer writes (tests/ha/chaos_trainer.py, bench/soak_trainer.py),
parsed as it grows: "r PASS ID" a record taken, "d PASS TASK EPOCH" a task reported done,
"x" a clean exit. Only whole lines are parsed, so a log cut by a SIGKILL reads cleanly."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Log:
    """What one trainer logged."""

    records: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    done: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    last: tuple[str, int, int] | None = None  # kind, pass, id of the last line
    count: int = 0
    exited: bool = False


class RecordLog:
    """One trainer's log file; `poll()` parses the lines appended since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = Log()
        self._offset = 0
        self._rest = b""

    def poll(self) -> Log:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.log
        self._offset += len(chunk)
        *lines, self._rest = (self._rest + chunk).split(b"\n")
        for raw in lines:
            kind, *rest = raw.decode().split()
            if kind == "r":
                p, rid = int(rest[0]), int(rest[1])
                self.log.records[p].append(rid)
                self.log.count += 1
                self.log.last = ("r", p, rid)
            elif kind == "d":
                p, tid = int(rest[0]), int(rest[1])
                self.log.done[p].add(tid)
                self.log.last = ("d", p, tid)
            elif kind == "x":
                self.log.exited = True
        return self.log

    def mid_task(self, per_task: int) -> bool:
        """Its last line is a record at least 5 records from its task's end (tasks of
        `per_task` records): a kill now cannot beat the log line of a task reported done."""
        last = self.log.last
        return last is not None and last[0] == "r" and last[2] % per_task <= per_task - 6
