"""`chunkmaster status`: what the master is doing, for people (or --json for machines)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from chunkmaster.cli.common import (
    add_master_location,
    add_security_flags,
    ask_master,
    duration_text,
)
from chunkmaster.core.sizes import size_text
from chunkmaster.logs import plural, printable


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="show a master's pass, its progress in records (rate, time left), queues, "
        "trainers, record counts and failed tasks",
        description="What the master is doing: the pass and its progress in records (done of "
        "the pass's total, the trainers' rate, the time that leaves), the queues, the trainers "
        "with a session, the record ledger and the tasks that failed, each reason once.",
    )
    add_master_location(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    add_security_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    st = ask_master(args, lambda conn: conn.status())
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(render(st))
    return 0


def render(st: dict[str, Any]) -> str:
    """The status for people: one line per part, the trainers and failures one line each."""
    lines = []
    stop = st.get("job_stopped")
    if stop:
        lines.append(f"STOPPED  {stop['message']}")
    lines.extend(f"WARNING  {w}" for w in st.get("warnings", []))
    lines.append(_dataset_line(st))
    lines.append(
        f"pass     {st['cur_pass']}: todo {st['todo']}, pending {st['pending']}, "
        f"done {st['done']}, failed {st['failed']}"
    )
    if st.get("progress") and st["ready"]:
        lines.append(f"progress {progress_text(st['progress'])}")
    store = st["store"]
    health = "ok" if store["healthy"] else f"UNAVAILABLE ({store['error']})"
    lines.append(f"store    {store['kind']}: {health}")
    if st.get("save_model"):
        sm = st["save_model"]
        lines.append(f"saving   {sm['trainer_id']} (window ends in {sm['expires_in']:.1f}s)")
    for led in st.get("ledger", []):
        again = ", ".join(f"{n} ({why})" for why, n in sorted(led["redispatched"].items()))
        lost = f"; quarantined {led['quarantined']}" if led.get("quarantined") else ""
        lines.append(
            f"records  pass {led['pass']}: {led['dispatched']} handed out, {led['consumed']} "
            f"consumed, {led['committed']} committed; handed out again: {again or 'none'}{lost}"
            + (f"; dropped {led['dropped']}" if led.get("dropped") else "")
            + (f"; padded {led['padded']}" if led.get("padded") else "")
            + _rollback_text(led)
        )
        if led.get("sources"):  # a mixture: what each source delivered in the pass
            lines.append(
                "           by source (handed out/consumed/committed): "
                + ", ".join(
                    f"{name} {c['dispatched']}/{c['consumed']}/{c['committed']}"
                    for name, c in led["sources"].items()
                )
            )
    lines.extend(_mixture(st))
    lines.extend(_steps(st))
    lines.extend(_trainers(st))
    lines.extend(_quarantine(st))
    if st["failed_tasks"]:
        lines.append(
            f"failures {plural(st['tasks_with_failures'], 'task')} failed at least once "
            f"(limit {st['failure_max']}, policy {st['failed_policy']}):"
        )
        for t in st["failed_tasks"]:
            lines.append(
                f"  task {t['id']} [{t['queue']}] {plural(t['total_failures'], 'failure')}: "
                + reasons_text(t["reasons"])
            )
    # Names, reasons, patterns and paths come from trainers and file systems: shown escaped,
    # one line each, unable to drive the terminal.
    return "\n".join(printable(line) for line in lines)


def _rollback_text(led: dict[str, Any]) -> str:
    """What restores of a data checkpoint cost the pass: the records they delivered again,
    and the commits the last one went on from ("" for a pass no restore touched)."""
    if not led.get("rolled_back") and not led.get("restored"):
        return ""
    return (
        f"; rolled back by a restore: {led.get('rolled_back', 0)} (delivered again; the "
        f"checkpoint held {led.get('restored', 0)} committed)"
    )


def _dataset_line(st: dict[str, Any]) -> str:
    if not st["ready"]:
        return "no dataset yet (waiting for a trainer's set_dataset)"
    ds = st["dataset"]
    size = ds.get("chunk_size")
    return (
        f"dataset  {plural(len(ds['globs']), 'pattern')}, "
        f"{plural(ds['files'], ds.get('format', 'recordio') + ' file')}, "
        f"{plural(ds['chunks'], 'chunk')}"
        + ("" if size is None else f" of up to {size_text(size)}")
        + f", {plural(ds['records'], 'record')}, {plural(st['num_tasks'], 'task')} of up to "
        f"{plural(ds['chunks_per_task'], 'chunk')}" + _shuffle_text(st)
    )


def _shuffle_text(st: dict[str, Any]) -> str:
    """The job's shuffle seed and window, if it has them (older masters send no window)."""
    seed, window = st.get("shuffle_seed"), st.get("shuffle_window") or 0
    text = "" if seed is None else f", shuffle seed {seed}"
    return text + (f", shuffle window {plural(window, 'record')}" if window else "")


def _mixture(st: dict[str, Any]) -> list[str]:
    """A mixture: its weights in force and each source's share, records and epoch."""
    mix = st.get("mixture")
    if not mix:
        return []
    schedule = mix["schedule"]
    shown = "; ".join(
        f"from record {p['records']:,}: " + ", ".join(f"{n}={w:g}" for n, w in p["weights"].items())
        for p in schedule
    )
    lines = [
        f"mixture  {plural(len(mix['sources']), 'source')}, {plural(mix['units'], 'unit')} a pass, "
        f"{mix['records_planned']:,} records planned; weights ({mix['mode']}) {shown}"
    ]
    for s in mix["sources"]:
        share = "-" if s["share"] is None else f"{100 * s['share']:.1f}%"
        lines.append(
            f"  {s['name']}: weight {100 * s['target']:.1f}%, consumed {share}; "
            f"{s['handed_out']:,} handed out, {s['consumed']:,} consumed, "
            f"{s['committed']:,} committed; epoch {s['epoch']} ({plural(s['tasks'], 'task')}, "
            f"{plural(s['records'], 'record')}, {s['format']})"
        )
    return lines


def _steps(st: dict[str, Any]) -> list[str]:
    """Equal steps: the pass's quota and what each trainer got, or whom the pass waits for."""
    steps = st.get("equal_steps")
    if not steps or steps["mode"] == "off":
        return []
    got = ", ".join(f"{n}" for n in steps["records"].values())
    if got:
        return [
            f"steps    equal ({steps['mode']}): {steps['target']} records per trainer this pass; "
            f"handed out so far: {got}"
        ]
    missing = steps.get("missing_ranks") or []
    waiting = (
        f" (world of {steps['world_size']}; waiting for {'rank' if len(missing) == 1 else 'ranks'} "
        f"{', '.join(map(str, missing))})"
        if missing
        else ""
    )
    return [
        f"steps    equal ({steps['mode']}): the pass's trainers are the sessions alive at its "
        f"first task{waiting}"
    ]


def _trainers(st: dict[str, Any]) -> list[str]:
    """The trainers with a session, one line each."""
    if "trainers" not in st:
        return []
    lines = [
        f"trainers {st['sessions']} with a session (lease {st['trainer_ttl']:g}s)"
        + (":" if st["trainers"] else "")
    ]
    if st["trainers"]:
        lines.append(
            f"  {'name':24} {'host':16} {'pid':>7} {'rank':>5} {'held':>4} {'consumed':>10} "
            f"{'rec/s':>9} {'heard':>7}  data wait p50/p99 (share)"
        )
    for t in st["trainers"]:
        rate = "-" if t["records_per_second"] is None else f"{t['records_per_second']:.1f}"
        heard = "-" if t["last_heard_s"] is None else f"{t['last_heard_s']:.1f}s"
        rank = "-" if t.get("rank") is None else str(t["rank"])
        w = t.get("data_wait")
        wait = (
            "-"
            if w is None
            else f"{w['p50_ms']:.1f}/{w['p99_ms']:.1f} ms ({100 * w['share']:.0f}%)"
        )
        lines.append(
            f"  {t['name'][:24]:24} {t['host'][:16]:16} {t['pid']:>7} {rank:>5} "
            f"{t['tasks_held']:>4} {t['records_consumed']:>10} {rate:>9} {heard:>7}  {wait}"
        )
    return lines


def _quarantine(st: dict[str, Any]) -> list[str]:
    """The error budget, and the quarantined tasks with their files, chunks and reasons."""
    budget = st.get("error_budget")
    if budget is None:
        return []
    limit = "no limit" if budget["limit"] is None else f"limit {budget['limit']} records"
    lines = [
        f"budget   --max-failed-records {budget['max_failed_records']} ({limit}): pass "
        f"{st['cur_pass']} lost {budget['quarantined']} records to quarantined tasks"
    ]
    if st["quarantined_tasks"]:
        lines.append(
            f"quarantine {plural(len(st['quarantined_tasks']), 'task')} left out of the pass:"
        )
    for q in st["quarantined_tasks"]:
        where = "; ".join(
            f"{path} at offset"
            + ("s " if sum(c["path"] == path for c in q["chunks"]) > 1 else " ")
            + ", ".join(str(c["offset"]) for c in q["chunks"] if c["path"] == path)
            for path in q["files"]
        )
        last = q["reasons"][-1]["reason"] if q["reasons"] else "no reason recorded"
        lines.append(
            f"  task {q['id']}: {plural(q['records'], 'record')} in {where}; last reason: {last}"
        )
    return lines


def progress_text(prog: dict[str, Any]) -> str:
    """The pass in records: done of its total, the trainers' rate and the time it leaves."""
    done, total = prog["records_done"], prog["records_total"]
    text = f"pass {prog['pass']}: {done:,} of {total:,} record{'' if total == 1 else 's'}"
    if total:
        text += f" ({100 * done // total}%)"
    rate = prog["records_per_second"]
    if rate is None:
        return text + "; no rate yet (trainers with a session report it)"
    text += f", {rate:,.1f} records/s"
    left = prog["seconds_left"]
    return text + ("" if left is None else f", about {duration_text(left)} left")


def reasons_text(reasons: list[dict[str, Any]]) -> str:
    """A task's failures, each reason once with how often and when: "bad CRC (4 times: pass
    0, epochs 1-4); trainer lost (pass 1, epoch 6)"."""
    by_reason: dict[str, list[tuple[int, int]]] = {}
    for r in reasons:
        by_reason.setdefault(r["reason"], []).append((r["pass"], r["epoch"]))
    parts = []
    for reason, when in by_reason.items():
        passes: dict[int, list[int]] = {}
        for p, epoch in when:
            passes.setdefault(p, []).append(epoch)
        at = ", ".join(
            f"pass {p}, {'epoch' if len(epochs) == 1 else 'epochs'} {_runs(epochs)}"
            for p, epochs in passes.items()
        )
        times = "" if len(when) == 1 else f"{len(when)} times: "
        parts.append(f"{reason or 'no reason given'} ({times}{at})")
    return "; ".join(parts)


def _runs(numbers: list[int]) -> str:
    """1, 2, 3, 5 as "1-3, 5"."""
    out: list[tuple[int, int]] = []
    for n in sorted(set(numbers)):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)
