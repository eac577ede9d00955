"""helpers/session_trainer.py run as a process: what a test starts, reads back and stops.

Its --out file holds "r PASS RECORD" per record taken and "c N" per commit (the script's
docstring has every line); its stderr goes to the .log beside it, with every thread's stack
there if the test stops it for hanging (faulthandler, SIGABRT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SESSION_TRAINER = str(Path(__file__).resolve().parent / "session_trainer.py")


class SessionTrainerProcess:
    """`args`: the script's flags (`--addr` or `--endpoints` among them)."""

    def __init__(self, out: Path, *args: str) -> None:
        self.out = out
        self.log = out.with_suffix(".log")
        cmd = [sys.executable, SESSION_TRAINER, "--out", str(out), *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(cmd, stderr=err, env=env)

    def lines(self) -> list[list[str]]:
        if not self.out.exists():
            return []
        return [ln.split() for ln in self.out.read_text().splitlines() if ln]

    def records(self, pass_id: int | None = None) -> list[int]:
        """The records taken in `pass_id` (in every pass if None), in the order taken."""
        return [
            int(ln[2])
            for ln in self.lines()
            if len(ln) == 3 and ln[0] == "r" and (pass_id is None or int(ln[1]) == pass_id)
        ]

    def read(self) -> int:
        """How many records it took, over every pass."""
        return sum(ln[0] == "r" for ln in self.lines())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 180.0) -> None:
        """Until it exits, which it must do cleanly; fail with its log otherwise."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(10)
            raise AssertionError(
                f"{self.out.stem} did not finish:\n{self.log.read_text()[-3000:]}"
            ) from None
        assert code == 0, f"{self.out.stem} exited {code}:\n{self.log.read_text()[-3000:]}"
