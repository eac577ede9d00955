"""A trainer that exits in order says Goodbye: the master ends its session as returned (its
tasks handed back at their positions), not "trainer lost" a lease later, the wording of a
crash. Ctrl-C (KeyboardInterrupt) out of a `with Client(...)`, or out of a script that never
closes its Client, `sys.exit()` with a Client left open, and SIGINT or SIGTERM to
`chunkmaster read`: each against a real master process whose log is read.

The trainer scripts wait for Ctrl-C in a main thread that wakes every second, as a busy training
loop does, not in one blocked in a lock (`threading.Event().wait()`): CPython raises the
KeyboardInterrupt in the main thread, and a SIGINT the kernel hands to another thread (gRPC's,
the client's) only sets a flag that a main thread blocked in a lock never looks at, so such a
script could wait for ever (seen in full runs under load). Should a trainer hang anyway,
faulthandler prints every thread's stack after 45 s and exits, and the test shows them."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.trainers import wait_until_holding

#: The trainer: reads a few records of pass 0, says READING, then waits to be stopped (Ctrl-C),
#: or exits at once (`exit`); `with`: its Client in a with block, else left open.
SCRIPT = textwrap.dedent(
    """
    import faulthandler, sys, time
    from chunkmaster.client import Client
    addr, path, mode = sys.argv[1:4]

    def read(client):
        client.set_dataset([path])
        client.start_get_records(0)
        for _ in range(5):
            client.next_record(timeout=60)
        print("READING", flush=True)
        if mode == "exit":
            sys.exit(0)
        faulthandler.dump_traceback_later(45, exit=True)  # a hang: every thread's stack
        while True:  # until Ctrl-C (see the module's text)
            time.sleep(1)

    if mode == "with":
        with Client(addr) as client:
            read(client)
    else:
        read(Client(addr))
    """
)


#: A rank's training loop with a torch Loader (two DataLoader workers), left open: takes a
#: batch, says READING, then waits for Ctrl-C.
LOADER_SCRIPT = textwrap.dedent(
    """
    import faulthandler, sys, time
    from chunkmaster.torch import Loader
    if __name__ == "__main__":
        addr, path = sys.argv[1:3]
        loader = Loader(addr, dataset=[path], batch_size=4, num_workers=2)
        for batch in loader:
            print("READING", flush=True)
            faulthandler.dump_traceback_later(45, exit=True)  # a hang: every thread's stack
            while True:  # until Ctrl-C (see the module's text)
                time.sleep(1)
    """
)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    # A lease that never runs out in the test: a session can only end by a Goodbye.
    m = MasterProcess(
        ["--store", str(tmp_path / "state.db"), "--chunk-per-task", "4", "--trainer-ttl", "600"],
        log_path=tmp_path / "master.log",
    ).start()
    yield m
    m.kill()


def _dataset(tmp_path: Path) -> str:
    return numbered_records(tmp_path / "d.rio", 400)


def _ended_as_returned(m: MasterProcess, pid: int) -> None:
    """The master logs the session of trainer process `pid` ended (returned)."""
    pattern = rf"trainer \S+ \(\S+, pid {pid}\) ended \((returned|trainer lost)\)"
    assert m.wait_log(pattern, timeout=30), m.log()
    found = re.search(pattern, m.log())
    assert found is not None and found.group(1) == "returned", m.log()


@contextlib.contextmanager
def _reading(
    tmp_path: Path, script: str, master: MasterProcess, *args: str
) -> Iterator[subprocess.Popen[str]]:
    """`script` run as a trainer of `master` (its argv: the address, a dataset, `args`), once
    it printed READING; killed after."""
    (tmp_path / "trainer.py").write_text(script)
    cmd = [sys.executable, str(tmp_path / "trainer.py"), str(master.addr), _dataset(tmp_path)]
    trainer = subprocess.Popen(
        [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline().strip() == "READING", trainer.communicate(timeout=30)
        yield trainer
    finally:
        trainer.kill()
        trainer.wait(10)


@pytest.mark.parametrize("mode", ["with", "open", "exit"])
def test_a_python_trainer_says_goodbye_on_an_orderly_exit(
    tmp_path: Path, master: MasterProcess, mode: str
) -> None:
    """Ctrl-C reaching `with Client(...)`'s exit, Ctrl-C with the Client never closed, and
    sys.exit() with it open: the client closes (at interpreter exit for the open one)."""
    with _reading(tmp_path, SCRIPT, master, mode) as trainer:
        if mode != "exit":
            trainer.send_signal(signal.SIGINT)
        _, err = trainer.communicate(timeout=60)
        assert trainer.returncode == (0 if mode == "exit" else -signal.SIGINT), err
        _ended_as_returned(master, trainer.pid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_read_says_goodbye_on_a_signal_mid_pass(
    tmp_path: Path, master: MasterProcess, sig: signal.Signals
) -> None:
    """`chunkmaster read` stopped mid-pass by Ctrl-C or SIGTERM: its session ends returned."""
    assert master.addr is not None
    cmd = [sys.executable, "-m", "chunkmaster", "read", "--addr", master.addr]
    cmd += ["--dataset", _dataset(tmp_path), "--passes=1", "--step-time=600"]
    trainer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_holding(master.addr, trainer.pid, 1)
        trainer.send_signal(sig)
        _, err = trainer.communicate(timeout=60)
        assert trainer.returncode == 128 + sig, err
        _ended_as_returned(master, trainer.pid)
    finally:
        trainer.kill()
        trainer.wait(10)


def test_a_loader_trainer_says_goodbye_on_ctrl_c(tmp_path: Path, master: MasterProcess) -> None:
    """Ctrl-C in a training loop over a Loader never closed: the rank's session says Goodbye."""
    pytest.importorskip("torch")
    with _reading(tmp_path, LOADER_SCRIPT, master) as trainer:
        trainer.send_signal(signal.SIGINT)
        _, err = trainer.communicate(timeout=60)
        assert trainer.returncode == -signal.SIGINT, err
        _ended_as_returned(master, trainer.pid)
