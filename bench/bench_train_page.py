"""Training in the browser against the command line (issue 38.3), timed in one run.

    python -m bench.bench_train_page [--rounds 1] [--steps 1000] [--before FOLDER ...]

Each round runs the command line's training, ``python -m mhsa train induction --out TMP`` (its
own process, timed from launch to exit, beside the seconds its trainer reports), then the Train
heads page's training with the page's defaults (``steps`` aside) in a real Streamlit server
driven by Debian's Chromium: from clicking Train until the finished run is shown (its Steps
metric), and until the live notice of the phase change appears in the browser. The rounds
alternate, so both sides run under the same machine state.

Printed per round and run: its time, its ratio to the round's command line (by the command
line's process wall time and by its trainer's seconds), the phase change's step and its time
(the page: in the browser since the click; the command line: its trainer's clock, interpolated
between its every-100-step lines), and the CPU seconds used: the command line's process; the
server's process and the browser's (Chromium and its driver) during the page's run.

``--cli-threads N``: also the command line with ``OMP_NUM_THREADS=N`` (the page's trainer
uses one core fewer than the machine has), its ratios to the plain command line.
``--before FOLDER`` (repeatable): also the page of another checkout of the app (``git archive
COMMIT | tar -x -C FOLDER``, or a variant being measured), served beside this one, in each round:
the before and after in one run; its rows are named after the folder.

Targets (issue 38): page <= 1.2x the command line; the phase change <= 30 s in the browser on
2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.browser import ROOT, chromium, streamlit_server, wait_for_app
from bench.common import print_table

_STEP_LINE = re.compile(r"step\s+(\d+)\s.*?induction\s+([\d.]+)\s+([\d.]+) s")


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc), 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(root: int, but: int) -> list[int]:
    """Processes under ``root`` (not ``root``), leaving out ``but`` and its own."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child != but:
                found.append(child)
                frontier.append(child)
    return found


def cli_round(steps: int, threads: int | None = None) -> dict:
    """The command line's training: process seconds, its trainer's seconds, the phase change
    (``threads``: ``OMP_NUM_THREADS`` for it; None: torch's default, every core)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "mhsa", "train", "induction", "--out", f"{tmp}/model"]
        start = time.perf_counter()
        done = subprocess.run(
            [*cmd, "--steps", str(steps)], cwd=ROOT, env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"the command line failed:\n{done.stderr[-2000:]}")
    trainer = float(re.search(r"accuracy [\d.]+ in ([\d.]+) s", done.stdout).group(1))
    phase = re.search(r"phase change at step (\d+)", done.stdout)
    phase_step = int(phase.group(1)) if phase else None
    lines = [(int(s), float(e)) for s, _, e in _STEP_LINE.findall(done.stderr)]
    return {
        "wall": wall,
        "trainer": trainer,
        "phase step": phase_step,
        "phase s": _at_step(lines, phase_step),
        "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    }


def _at_step(lines: list[tuple[int, float]], step: int | None) -> float | None:
    """The trainer's clock at ``step``, interpolated between its progress lines."""
    if step is None:
        return None
    for (s0, e0), (s1, e1) in itertools.pairwise(lines):
        if s0 <= step <= s1:
            return e0 + (e1 - e0) * (step - s0) / max(1, s1 - s0)
    return None


def page_round(url, browser, steps: int) -> dict:
    """The page's training: click to finished, click to the live phase-change notice."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    try:
        page.goto(f"{url}/Train_heads?steps={steps}")
        wait_for_app(page, timeout_ms=180_000)
        main = page.locator("[data-testid='stMain']")
        server0 = url.cpu_seconds()
        browsers = _descendants(os.getpid(), url.pid)
        browser0 = sum(_proc_cpu(p) for p in browsers)
        train = main.get_by_role("button", name="Train", exact=True)
        train.wait_for(timeout=300_000)  # a busy machine draws the page slowly
        start = time.perf_counter()
        train.click(timeout=300_000)
        notice = main.get_by_text(re.compile(r"Phase change at step \d+, [\d.]+ s into training"))
        finished = main.get_by_text(f"{steps} of {steps}")
        phase_s, phase_step, phase_trainer = None, None, None
        deadline = start + 3600
        while time.perf_counter() < deadline:
            if phase_s is None and notice.count():
                phase_s = time.perf_counter() - start
                found = re.search(r"step (\d+), ([\d.]+) s", notice.first.inner_text())
                phase_step, phase_trainer = int(found.group(1)), float(found.group(2))
            if finished.count():
                break
            page.wait_for_timeout(100)
        else:
            raise RuntimeError("the page's training did not finish within an hour")
        wall = time.perf_counter() - start
        metrics = {
            m.locator("[data-testid='stMetricLabel']").inner_text().strip(): m.locator(
                "[data-testid='stMetricValue']"
            ).inner_text()
            for m in main.locator("[data-testid='stMetric']").all()
        }
        return {
            "wall": wall,
            "trainer": float(metrics["Seconds"]),
            "phase step": phase_step or metrics.get("Phase change"),
            "phase s": phase_s,
            "phase trainer s": phase_trainer,
            "server cpu": url.cpu_seconds() - server0,
            "browser cpu": sum(_proc_cpu(p) for p in browsers) - browser0,
        }
    finally:
        page.close()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _row(round_: int, what: str, run: dict, cli: dict | None) -> dict:
    """A table row: the run's times, its ratios to the round's command line, its phase change
    and CPU seconds."""
    cpu = (
        f"{run['cpu']:.1f}"
        if "cpu" in run
        else (f"{run['server cpu']:.1f} + {run['browser cpu']:.1f}")
    )
    return {
        "round": round_,
        "run": what,
        "s (to finished)": _fmt(run["wall"]),
        "trainer s": _fmt(run["trainer"]),
        "/ CLI process": "-" if cli is None else f"{run['wall'] / cli['wall']:.2f}",
        "/ CLI trainer": "-" if cli is None else f"{run['wall'] / cli['trainer']:.2f}",
        "phase change step": run["phase step"],
        "phase change s": _fmt(run["phase s"]),
        "CPU s (CLI; server + browser)": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1000, help="the page's default: 1000")
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="another checkout's page"
    )
    parser.add_argument(
        "--no-cli", action="store_true", help="the pages only (compare checkouts' pages)"
    )
    parser.add_argument(
        "--cli-threads",
        type=int,
        help="also the command line with OMP_NUM_THREADS set to this, in each round",
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.1f} at the start, steps {args.steps}")
    rows = []
    with contextlib.ExitStack() as stack:
        servers = {"page": stack.enter_context(streamlit_server(timeout=300))}
        for folder in args.before:
            servers[f"page of {folder.name}"] = stack.enter_context(
                streamlit_server(timeout=300, root=folder.resolve())
            )
        browser = stack.enter_context(chromium())
        for round_ in range(1, args.rounds + 1):
            cli = None if args.no_cli else cli_round(args.steps)
            if cli is not None:
                rows.append(_row(round_, "command line", cli, cli))
                print(rows[-1], flush=True)
            if args.cli_threads:
                alone = cli_round(args.steps, args.cli_threads)
                what = f"command line, OMP_NUM_THREADS={args.cli_threads}"
                rows.append(_row(round_, what, alone, cli))
                print(rows[-1], flush=True)
            for name, url in servers.items():
                rows.append(_row(round_, name, page_round(url, browser, args.steps), cli))
                print(rows[-1], flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()
