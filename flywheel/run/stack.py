"""One local stack: a broker with the run's topics, the object store when the data dir is on one, the FLYWHEEL_*
environment of the run's child processes, and the faust worker. `flywheel demo`, `flywheel demonstrations`, the
pipeline bench and the tests each run in one.

The broker is the external cluster when `bootstrap_servers` is set, else the local one: reused when it already
runs (a session's, an outer stack's), otherwise started here and stopped on exit. Children (`flywheel <command>`
in a fresh interpreter) get the run's settings through their environment and are all stopped on exit, error or not.
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.object_store import join
from core.processes import Child
from core.settings import Settings, settings_env
from lake import s3proxy
from registry.signing import load_or_create_key, trust
from streams.broker import local_broker
from streams.broker.roles import role_settings, uses_roles
from streams.broker.tls import local_cafile


@dataclass
class LocalStack:
    settings: Settings
    """The run's settings: its topic prefix and data dir."""
    logs: Path
    """Each child writes <logs>/<name>.log."""
    env: dict[str, str] = field(repr=False)  # holds the SASL password
    """What every child gets on top of os.environ: the run's FLYWHEEL_* and the caller's extras."""
    workers: list[Child] = field(default_factory=list)
    children: list[Child] = field(default_factory=list, repr=False)
    broker_stopped: bool = False
    nodes_stopped: set[int] = field(default_factory=set)
    machines: Path | None = None
    """Set: every child runs as on a machine of its own, in machines/<name>/ with its own FLYWHEEL_HOME there,
    sharing only Kafka and the object store (and the learner's public key, provisioned to each as a deployment
    would); None: all share this process's home and working dir."""

    def machine_home(self, name: str) -> Path | None:
        """The FLYWHEEL_HOME of child `name` when machines are simulated."""
        return self.machines / name / "home" if self.machines is not None else None

    def settings_of(self, name: str) -> Settings:
        """The settings child `name` runs with (its own home on its own machine)."""
        home = self.machine_home(name)
        return self.settings if home is None else self.settings.model_copy(update={"home": home})

    @property
    def worker(self) -> Child:
        """The newest faust worker."""
        if not self.workers:
            raise RuntimeError("no faust worker runs in this stack")
        return self.workers[-1]

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None,
              cpus: set[int] | None = None, role: str | None = None, machine: str | None = None) -> Child:  # fmt: skip
        """`flywheel <args>` with the run's settings (and `env` on top), on `cpus` (None: any), stopped when the
        stack closes; on a machine of its own when machines are simulated (`machine`: on that child's instead, to
        read its files). `role` (streams.broker.roles: edge, worker, learner): the child logs in to Kafka as that role,
        allowed only what it needs; None: as the stack does."""
        home, machine_env = self.machine_home(machine or name), {}
        if role is not None and uses_roles(self.settings):
            login = role_settings(self.settings, role)
            machine_env = {"FLYWHEEL_SASL_USERNAME": login.sasl_username,
                           "FLYWHEEL_SASL_PASSWORD": login.sasl_password.get_secret_value()}  # fmt: skip
        if home is not None:
            (home / "keys" / "trusted").mkdir(parents=True, exist_ok=True)
            trust(self._learner_key().public_key(), home / "keys" / "trusted")  # provisioned, as a deployment does
            machine_env |= {"FLYWHEEL_HOME": str(home)}
        cwd = home.parent if home is not None else None
        child = Child(name, list(args), self.logs, {**self.env, **machine_env, **(env or {})}, cpus, cwd)
        self.children.append(child)
        return child

    def start_worker(self, *args: str, env: Mapping[str, str] | None = None) -> Child:
        """One more `flywheel process`: 'processors', then 'processors-1', ... (their log names)."""
        name = f"processors-{len(self.workers)}" if self.workers else "processors"
        self.workers.append(self.start(name, ["process", *args], env, role="worker"))
        return self.worker

    def _learner_key(self):
        """The signing key on the learner's machine (made there before it starts), whose public half every
        machine trusts."""
        return load_or_create_key(self.settings_of("learner").keys_dir)

    def stop_broker(self) -> None:
        """Take the local broker down (fault tests); its data stays. Brought back on close if not before."""
        self._refuse_external()
        local_broker.down(self.settings)
        self.broker_stopped = True

    def start_broker(self) -> None:
        self._refuse_external()
        local_broker.up(self.settings)
        self.broker_stopped = False
        self.nodes_stopped.clear()

    def stop_node(self, node: int, sig: int = signal.SIGTERM) -> None:
        """Take one node of the local cluster down (SIGKILL: a crash); brought back on close if not before."""
        self._refuse_external()
        self.nodes_stopped.add(node)
        local_broker.stop_node(self.settings, node, sig)

    def start_node(self, node: int) -> None:
        self._refuse_external()
        local_broker.start_node(self.settings, node)
        self.nodes_stopped.discard(node)

    def close(self) -> None:
        """Stop every child, newest first (clients before the worker they feed), and bring a stopped broker or node
        back."""
        for child in reversed(self.children):
            child.stop()
        if self.broker_stopped or self.nodes_stopped:  # a session's broker outlives this stack: leave it as found
            self.start_broker()

    def _refuse_external(self) -> None:
        if self.settings.uses_external_kafka:
            raise local_broker.BrokerError("an external cluster is not this stack's to stop or start")


@contextmanager
def local_stack(
    settings: Settings,
    logs: Path,
    *,
    run: str | None = None,
    data_dir: Path | None = None,
    worker: bool = True,
    env: Mapping[str, str] | None = None,
    machines: Path | None = None,
    worker_args: Sequence[str] = (),
) -> Iterator[LocalStack]:
    """A broker with topics for the run, its worker (unless `worker=False`; `flywheel process` with `worker_args`),
    everything stopped on exit.

    `run` gives the run topics of its own (`<prefix>-<run>-<time>-<random>`), `data_dir` tables and artifacts of
    its own, so runs never read each other's events or models. `env` goes to every child (e.g. metrics discovery).
    `machines`: each child as on a machine of its own (LocalStack.machines).
    """
    with s3proxy.running_objectstore(settings) as reachable:
        settings = run_settings(reachable, run, data_dir)
        with local_broker.running_broker(settings):
            stack = LocalStack(settings, logs, {**child_env(settings), **(env or {})}, machines=machines)
            try:
                if worker:
                    stack.start_worker(*worker_args)
                yield stack
            finally:
                stack.close()


def run_settings(settings: Settings, run: str | None = None, data_dir: Path | None = None) -> Settings:
    """`settings` with the run's own topic prefix (when `run` is given) and data dir (when given): `data_dir` itself
    on a local data dir, a prefix of the run's own under it on the object store."""
    update: dict[str, object] = {}
    # Time for a person reading names, random bits for two runs started in the same second.
    stamp = f"{run or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    if run:
        update["topic_prefix"] = f"{settings.topic_prefix}-{stamp}"
    if data_dir is not None and settings.data_is_remote:
        update["data_dir"] = str(join(settings.data_dir, stamp))
    elif data_dir is not None:
        update["data_dir"] = str(data_dir.resolve())  # children may run elsewhere; reports store paths relative to it
    return settings.model_copy(update=update)


def child_env(settings: Settings) -> dict[str, str]:
    """FLYWHEEL_* of a child of the stack: the run's settings, with the broker's address as an external cluster's,
    so a child never starts or stops a broker of its own, and the CA it trusts named (provisioned, on a machine of
    its own)."""
    return settings_env(
        settings.model_copy(update={"bootstrap_servers": settings.bootstrap, "ssl_cafile": local_cafile(settings)})
    )
