"""examples/train_ddp.py as overlays/torchrun runs it: against a master that wants a token
and speaks TLS, the token from a file and the CA given by flags (--token-file, --tls-ca). Two
ranks under a real torchrun (CPU, gloo), one pass: every record trained on once, but for those
equal steps dropped."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers.datasets import write_records
from helpers.deploy import REPO, server_pki

from chunkmaster.client.connection import ChannelSecurity, MasterConnection

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "train_ddp.py"
RECORD = struct.Struct("<q5f")
RECORDS = 400


def test_ddp_ranks_read_from_a_master_with_a_token_over_tls(
    tmp_path: Path, master_process: Any
) -> None:
    rng = random.Random(1)
    records = [RECORD.pack(i, *(rng.random() for _ in range(5))) for i in range(RECORDS)]
    write_records(tmp_path / "data.rio", records, max_chunk_size=400)
    ca, cert, key = server_pki(tmp_path, "localhost", ips=("127.0.0.1",))
    token = tmp_path / "token"
    token.write_text("ddp-job-token-0123456789\n")
    m = master_process(
        "--equal-steps", "drop", "--chunk-per-task", "1", "--token-file", str(token),
        "--tls-cert", cert, "--tls-key", key,
    )  # fmt: skip
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert exe is not None, "torchrun is installed with torch"
    cmd = [exe, "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--addr", m.addr]
    cmd += ["--token-file", str(token), "--tls-ca", ca, "--dataset", str(tmp_path / "data.rio")]
    cmd += ["--records", str(RECORDS), "--passes", "1", "--workers", "1"]
    cmd += ["--checkpoint", str(tmp_path / "c.pt"), "--report", str(tmp_path / "report.json")]
    env = {k: v for k, v in os.environ.items() if k != "CHUNKMASTER_TOKEN"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=dict(env, OMP_NUM_THREADS="1")
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (seen,) = json.loads((tmp_path / "report.json").read_text())["seen"]
    security = ChannelSecurity.load(token.read_text().strip(), ca)
    with MasterConnection(m.addr, security=security) as c:
        (ledger,) = [led for led in c.status()["ledger"] if led["pass"] == 0]
    assert set(seen) <= {0, 1}
    assert seen.count(0) == ledger["dropped"] < 2  # fewer than the ranks
