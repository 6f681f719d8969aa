"""`flywheel bench security`: the wall time of one short demo over PLAINTEXT and over SASL_SSL (TLS, SCRAM, ACLs),
each in a home of its own with its own broker, alternating `runs_per_mode` times (a slow minute of the shared box hits
both); DIR/security_bench.json, medians side by side and their ratio (target: within 1.3x)."""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from core.machine import machine
from core.processes import free_ports
from core.settings import Settings, settings_env
from streams.broker.jars import share_jars

MODES = ("PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class SecurityBenchConfig:
    out: Path
    """Each run's demo goes to out/<mode>-<k>/, the figures to out/security_bench.json."""
    runs_per_mode: int = 2
    """Runs of each mode, alternating; the figures are medians."""
    demo: str = "--turns 2 --clients 1 --tasks click-test,click-button --episodes-per-task 4 --sft-steps 15"
    """The demo's flags (both modes run the same; --out and --no-prometheus are added)."""


def run_bench(config: SecurityBenchConfig, settings: Settings) -> dict:
    config.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(config.runs_per_mode):
        for mode in MODES:
            runs.append(run := run_demo(config, settings, mode, config.out.resolve() / f"{mode.lower()}-{k}"))
            print(f"{mode}: {run['wall_s']:.1f} s, {run['steps_landed']} steps landed", flush=True)
    medians = {mode: statistics.median(r["wall_s"] for r in runs if r["mode"] == mode) for mode in MODES}
    report = {"config": {k: str(v) for k, v in asdict(config).items()}, "machine": machine(), "runs": runs,
              "median_wall_s": medians, "sasl_ssl_over_plaintext": round(medians["SASL_SSL"] / medians["PLAINTEXT"], 3),
              "target": "SASL_SSL wall time within 1.3x PLAINTEXT"}  # fmt: skip
    (config.out / "security_bench.json").write_text(json.dumps(report, indent=2))
    print(f"median wall time: PLAINTEXT {medians['PLAINTEXT']:.1f} s, SASL_SSL {medians['SASL_SSL']:.1f} s, "
          f"ratio {report['sasl_ssl_over_plaintext']}x (target <= 1.3x)")  # fmt: skip
    return report


def run_demo(config: SecurityBenchConfig, settings: Settings, mode: str, out: Path) -> dict:
    """One demo in a home of its own (`out`, absolute), on a broker it starts and stops: wall time, outcome."""
    login = (
        {"sasl_username": "flywheel-admin", "sasl_password": secrets.token_urlsafe(16)} if mode != "PLAINTEXT" else {}
    )
    run_settings = Settings(home=out / "home", data_dir=out / "data", kafka_port=free_ports(2), bootstrap_servers="",
                            topic_prefix=f"bench-{mode.lower()}", security_protocol=mode, **login)  # fmt: skip
    share_jars(run_settings, settings)
    args = [*config.demo.split(), "--no-prometheus", "--out", str(out / "demo")]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flywheel.cli", "demo", *args], capture_output=True, text=True,
                          env={**os.environ, **settings_env(run_settings)})  # fmt: skip
    wall_s = time.perf_counter() - started
    (out / "demo.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} demo failed (exit {done.returncode}); see {out / 'demo.log'}")
    turns = json.loads((out / "demo" / "report.json").read_text())["turns"]
    return {"mode": mode, "wall_s": round(wall_s, 1), "steps_landed": sum(t["steps_in_delta"] for t in turns),
            "steps_published": sum(t["steps_published"] for t in turns),
            "published": [t["published_version"] for t in turns]}  # fmt: skip


def command(config: SecurityBenchConfig, settings: Settings) -> int:
    """`flywheel bench security`: exit 1 when a run did not land every step it published."""
    report = run_bench(config, settings)
    return 0 if all(run["steps_landed"] == run["steps_published"] for run in report["runs"]) else 1
