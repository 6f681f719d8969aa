"""The edge loop: think -> act -> verify in MiniWoB++, every step published to Kafka.

One client = one browser. With `policy="model"` the client follows the model-versions topic and
swaps in each new verified version at the next episode boundary.
"""

from __future__ import annotations

import json
import time
import zlib
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from core.metrics import await_scrape, serve_metrics
from core.processes import sigterm_requests_stop
from core.settings import TIER1_TASKS, Settings
from edge_client import metrics
from edge_client.env import EnvConfig, GuiEnv
from edge_client.episode import StepRecord, run_episode
from edge_client.exploration import NewTaskSampler
from edge_client.search import SearchBudget, SearchResult, search_failure
from edge_client.spool import SPOOL_MAX_BYTES, Spool, SpooledRecord, SpoolingPublisher, spool_dir
from edge_client.teacher import Teacher, TeacherConfig
from policy.interface import Policy
from policy.sampling import Sampling
from policy.screen import encode_png
from schemas import EventDecodeError, StepEvent, decode_event, encode_event, new_event_id
from streams.kafka_clients import make_producer
from streams.topics import topics_for


@dataclass
class EdgeConfig:
    client_id: str
    """Names this client in every event and in episode ids."""
    tasks: tuple[str, ...] = TIER1_TASKS
    """MiniWoB++ task ids to cycle through."""
    episodes_per_task: int = 10
    """Episodes run on each task (each `repeats` times)."""
    policy: Literal["expert", "model"] = "model"
    """'model' (newest ONNX version from the model-versions topic) or 'expert' (scripted DOM oracles)."""
    max_steps: int = 10
    """An episode still running after this many steps ends as a failure (termination 'max_steps')."""
    seed: int = 0
    """Seed of the first episode; episode i of a task uses seed + i."""
    repeats: int = 1
    """Runs of each (task, seed) in a row: sampled rollouts of one start state, a GRPO group for the learner."""
    seeds_per_visit: int = 1
    """Seeds of a task run in a row before the next task: a task switch is a page load and a warm-up start
    (~0.7 s here), so few repeats per seed and one seed per visit spend much of the fleet's time switching."""
    channel: str | None = None
    """Model-versions channel to follow; None: canary for settings.canary_fraction of clients, else stable."""
    wait_for_model_s: float = 120.0
    """With policy='model': how long to wait for a first version before giving up."""
    bootstrap_expert: bool = False
    """With policy='model': run the scripted experts until a first version arrives (their episodes are
    demonstrations) instead of waiting for it; a fleet that starts before its first model never idles."""
    intra_op_threads: int = 1
    """onnxruntime threads (the box is shared)."""
    temperature: float = 0.0
    """With policy='model': sampling temperature of every generated token (0: greedy, no exploration)."""
    top_k: int = 0
    """With policy='model' and temperature > 0: sample among the k likeliest allowed tokens (0: all)."""
    metrics_port: int | None = 0
    """/metrics port (0: any free port, None: do not serve)."""
    summary_path: Path | None = None
    """Where to write the run summary as JSON."""
    stop_after_s: float = 0.0
    """Stop at the first episode boundary after this many seconds (0: run all episodes)."""
    spool_timeout_s: float = 120.0
    """At exit, how long to wait for the spool to reach Kafka (what is left is sent by the next run)."""
    spool_max_bytes: int = SPOOL_MAX_BYTES
    """Bound of the on-disk spool of events Kafka has not acknowledged: at the bound the client stops with an error
    that says so, rather than fill the disk."""
    ledger_path: Path | None = None
    """Append each step's line 'event_id episode_id' (' end' after an episode's final step) to this file once it is
    in the spool (a client's own record of what it owes the tables: `flywheel chaos` checks each is in Delta exactly
    once, and each episode closed)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """With policy='model': which screens the DOM teacher labels, and its budget (edge_client.teacher)."""
    new_tasks: tuple[str, ...] = ()
    """Tasks nobody demonstrated, run beside `tasks`: only a model acts on them, never the experts (a fleet on them
    waits for its first version) nor the teacher; each seed `new_task_repeats` times, sampled over every token at
    temperatures the task's success sets (edge_client.exploration)."""
    new_task_repeats: int = 8
    """Runs of each seed of a new task (K): where one run in many succeeds, K runs find it. They climb a ladder of
    temperatures, from new_task_min_temperature to a top set by the task's success."""
    new_task_temperature: float = 3.0
    """The top of a new task's ladder while the running version has not solved it once ..."""
    new_task_min_temperature: float = 0.5
    """... falling linearly with its success under that version to the ladder's foot, this, at success 1."""
    new_task_stall_steps: int = 3
    """A new task's sampled run ends at its this-many-th action in a row on one unchanged screen (as max_steps): a
    policy that clicks where nothing happens spends the rest of its 10 steps there (0: never)."""
    new_task_search_steps: int = 100
    """Where all K runs of a new task's seed failed: environment steps the search from the first of them may spend
    (edge_client.search: the seed reset, its prefix replayed, the policy's other likely actions and then the
    screen's elements, read from its pixels, tried at a failing step, the policy finishing each branch; 0: no
    search). Its successes are published as episodes of their own."""

    def __post_init__(self) -> None:
        if self.spool_max_bytes <= 0:
            raise ValueError(f"spool_max_bytes must be > 0, not {self.spool_max_bytes}")


# `flywheel edge`'s flags where they are not --field-name: the CLI derives its parser with them (flywheel.cli), the
# runs that start clients their command lines (core.cli_config.config_argv).
FLAG_NAMES = {"episodes_per_task": "--episodes", "wait_for_model_s": "--wait-for-model", "summary_path": "--summary"}

ACTING_GAP_S = 0.5  # an episode boundary (swap, reset) shorter than this is not idleness
# A new task's search: branches in all, and the screen's elements tried at a failing step after the policy's own 3
# candidates. count-sides shows 7 elements (the instruction, the shape, 5 buttons): all of them fit.
NEW_TASK_SEARCH_BRANCHES = 16
NEW_TASK_SEARCH_ELEMENTS = 12


@dataclass
class RunSummary:
    client_id: str
    steps_published: int = 0
    episodes: int = 0
    per_task: dict[str, dict[str, int]] = field(default_factory=dict)
    model_versions: list[str] = field(default_factory=list)
    unsent: int = 0  # still in the spool at exit (Kafka unreachable); sent by the next run of this client
    acting: list[list[float]] = field(default_factory=list)  # [start, end] wall-clock spans spent in episodes
    teacher_labels: dict[str, int] = field(default_factory=dict)  # labels received, by why asked
    teacher_skipped: dict[str, int] = field(default_factory=dict)  # labels due but not had, by why
    teacher_reused: int = 0  # labels given again to a screen labelled before (no call)
    search: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("searches", "simulations", "env_steps", "successes", "published_steps"), 0
        )
    )  # new tasks' searches, all together; published_steps: the successes' steps, which are published as episodes

    def record_search(self, found: SearchResult) -> None:
        for key, value in (("searches", 1), ("simulations", found.simulations), ("env_steps", found.env_steps),
                           ("successes", len(found.successes)),
                           ("published_steps", sum(r.steps for r in found.successes))):  # fmt: skip
            self.search[key] += value

    def record_acting(self, start: float, end: float) -> None:
        """Adds an episode's span, merged with the previous one when they touch (one span per busy stretch)."""
        if self.acting and start - self.acting[-1][1] <= ACTING_GAP_S:
            self.acting[-1][1] = end
        else:
            self.acting.append([start, end])

    def record_episode(self, task: str, success: bool) -> None:
        entry = self.per_task.setdefault(task, {"episodes": 0, "successes": 0})
        entry["episodes"] += 1
        entry["successes"] += int(success)
        self.episodes += 1


def run_client(config: EdgeConfig, settings: Settings) -> RunSummary:
    if config.metrics_port is not None:
        serve_metrics("flywheel-edge", settings.metrics_host, config.metrics_port, client_id=config.client_id)
    summary = RunSummary(config.client_id)
    metrics.declare_tasks(config.tasks, config.new_tasks)
    delivered = Tally()

    def on_delivered(record: SpooledRecord) -> None:
        try:
            task = decode_event(record.value, expect=StepEvent).task
        except EventDecodeError:  # left by an earlier client version: delivered all the same, the drain goes on
            task = "unknown"
        delivered[task] += 1
        metrics.STEPS_PUBLISHED.labels(task).inc()

    # Events go to the on-disk spool first and reach Kafka from there, in order, whenever it answers. What an earlier
    # run of this client left there (killed, or stopped before Kafka took it) goes first; a run of this client still
    # alive holds the spool, and this one stops here with SpoolInUse instead of sending its records a second time.
    publisher = SpoolingPublisher(
        Spool(spool_dir(settings.home, config.client_id), config.spool_max_bytes),
        lambda: make_producer(settings, config.client_id),
        on_delivered,
    )
    steps_topic = topics_for(settings).steps.name

    ledger = open(config.ledger_path, "a", buffering=1) if config.ledger_path is not None else None  # noqa: SIM115

    def publish(event: StepEvent) -> None:
        line = f"{event.event_id} {event.episode_id}{' end' if event.done else ''}\n"
        if ledger is not None:  # one write per line (line-buffered): a kill cuts no line
            # Before the spool: a kill between the two lines leaves a step that may or may not be spooled (and the
            # drain may even have delivered it), so the ledger check neither owes it nor calls it a stray.
            ledger.write(f"spooling {line}")
        publisher.publish(steps_topic, event.episode_id.encode(), encode_event(event))
        if ledger is not None:
            ledger.write(line)  # the spool has it: owed from now on
        metrics.SPOOL_DEPTH.set(publisher.depth())

    policies = _policy_source(config, settings)
    new_tasks = set(config.new_tasks)
    sampler = NewTaskSampler(config.new_task_temperature, config.new_task_min_temperature)
    from edge_client.experts import expert_for  # the teacher: the DOM expert, asked only about a model's steps

    teacher = Teacher(config.teacher, expert_for) if config.policy == "model" and config.teacher.active else None
    # A model reads pixels only; the DOM is read for the scripted experts (and a fleet that starts on them).
    reads_dom = config.policy == "expert" or config.bootstrap_expert
    env = GuiEnv((config.tasks + config.new_tasks)[0], EnvConfig(read_dom=reads_dom))
    schedule = episode_schedule(config)
    deadline = time.monotonic() + config.stop_after_s if config.stop_after_s > 0 else None
    base = exploration(config)  # the client's sampler; a new task's runs take it to their temperature
    unavailable = None  # the task of the visit being skipped: no policy may act on it yet
    group: list = []  # the runs so far of the new task's seed being explored
    # SIGTERM (a restart, a deploy) ends the client at the next episode boundary, its spool drained: an episode
    # cut off mid-way would leave steps whose episode never ends.
    with sigterm_requests_stop() as stop_requested:
        try:
            for run, (index, task, repeat) in enumerate(schedule):
                if stop_requested.is_set() or (deadline is not None and time.monotonic() > deadline):
                    break
                if task == unavailable:
                    continue
                policy = policies(task)
                if policy is None:  # a new task before the first version: nothing may act on it, this visit
                    unavailable = task
                    continue
                unavailable = None
                if repeat and not samples(policy, config, task):
                    continue  # a deterministic policy would only replay the same episode
                if task in new_tasks and index % config.seeds_per_visit and not sampler.worth_all_seeds(
                        task, policy.version):  # fmt: skip
                    continue  # one seed a visit where nothing was found yet, or the version solves it
                if policy.version != "expert" and hasattr(policy, "sampling"):
                    policy.sampling = (
                        sampler.sampling(task, policy.version, base, repeat, config.new_task_repeats)
                        if task in new_tasks
                        else base
                    )
                if policy.version not in summary.model_versions:
                    summary.model_versions.append(policy.version)
                    metrics.use_model_version(policy.version, config.tasks + config.new_tasks)
                    await_scrape()  # the launcher's Prometheus sees the new series at 0 before they count
                seed = config.seed + index
                episode_id = f"{config.client_id}-{task}-{seed}-{run}"
                on_step = step_publisher(publish, config.client_id, episode_id, task, seed, policy.version)
                started = time.time()
                asks = teacher if policy.version != "expert" and task not in new_tasks else None
                stall = config.new_task_stall_steps if task in new_tasks else 0
                result = run_episode(env, policy, task, seed, config.max_steps, on_step, asks, stall)
                if task in new_tasks:
                    group = [result] if repeat == 0 else [*group, result]
                    for k, found in enumerate(explore_further(env, policy, group, sampler, config, summary, run)):
                        on_found = step_publisher(publish, config.client_id, f"{episode_id}-search{k}", task, seed,
                                                  policy.version)  # fmt: skip
                        for record in found.records:  # a success the search found: an episode of its own
                            on_found(record)
                        summary.record_episode(task, True)
                summary.record_acting(started, time.time())
                summary.record_episode(task, result.success)
                metrics.EPISODES.labels(task, "success" if result.success else "failure", policy.version).inc()
        finally:
            env.close()
            summary.unsent = publisher.close(timeout_s=config.spool_timeout_s)
            metrics.SPOOL_DEPTH.set(summary.unsent)
            if ledger is not None:
                ledger.close()
    summary.steps_published = sum(delivered.values())
    if teacher is not None:
        summary.teacher_labels, summary.teacher_skipped = dict(teacher.labels), dict(teacher.skipped)
        summary.teacher_reused = teacher.reused
    if config.summary_path is not None:
        config.summary_path.write_text(json.dumps(summary.__dict__, indent=2))
    return summary


def explore_further(env: GuiEnv, policy: Policy, group: list, sampler: NewTaskSampler, config: EdgeConfig,
                    summary: RunSummary, run: int) -> list:  # fmt: skip
    """After a run of a new task's seed (the last of `group`, its runs so far): its ending counted for the task's
    temperature; after the K-th run, if all K failed, the search from the first. Returns the successes it found."""
    latest = group[-1]
    sampler.record(latest.task, policy.version, latest.success)
    if len(group) < config.new_task_repeats or any(r.success for r in group) or config.new_task_search_steps <= 0:
        return []
    found = search_new_task(env, policy, group[0], config, run)
    summary.record_search(found)
    if found.successes:
        sampler.found.add(latest.task)  # a success to learn from, not one the version drew
    return found.successes


def explore_seed(env: GuiEnv, policy: Policy, sampler: NewTaskSampler, base: Sampling, config: EdgeConfig,
                 summary: RunSummary, task: str, seed: int, run: int) -> tuple[list, list]:  # fmt: skip
    """A new task's seed as the fleet explores it: `new_task_repeats` runs on the task's temperature ladder (`base`
    over every token), then the search where all of them failed. `run`: the runs before these (the search's seed).
    Returns (the runs, the successes the search found)."""
    group, found = [], []
    for repeat in range(config.new_task_repeats):
        policy.sampling = sampler.sampling(task, policy.version, base, repeat, config.new_task_repeats)
        group.append(run_episode(env, policy, task, seed, config.max_steps, stall_steps=config.new_task_stall_steps))
        found = explore_further(env, policy, group, sampler, config, summary, run + repeat + 1)
    return group, found


def search_new_task(env: GuiEnv, policy: Policy, failed, config: EdgeConfig, run: int) -> SearchResult:
    """Search from a new task's failed run (all K runs of its seed failed): the policy's other likely actions at its
    failing steps, each branch finished by the policy itself, greedily. No teacher: nothing but the policy and the
    verified ending may act on a new task."""
    if not hasattr(policy, "runtime"):  # a policy without a decoder to ask for its other actions
        return SearchResult(failed.task, failed.seed)
    sampling = policy.sampling
    policy.sampling = replace(sampling, temperature=0.0, top_k=0)  # branches finished as the policy would deploy
    try:
        budget = SearchBudget(env_steps=config.new_task_search_steps, simulations=NEW_TASK_SEARCH_BRANCHES,
                              element_candidates=NEW_TASK_SEARCH_ELEMENTS)  # fmt: skip
        return search_failure(env, policy, failed, budget, seed=zlib.crc32(config.client_id.encode()) + run,
                              max_steps=config.max_steps)  # fmt: skip
    finally:
        policy.sampling = sampling


def episode_schedule(config: EdgeConfig) -> Iterator[tuple[int, str, int]]:
    """(seed index, task, repeat) of each episode in order: the tasks, then the new tasks, in turn, `seeds_per_visit`
    seeds of a task per visit, each seed `repeats` times in a row (a new task's `new_task_repeats`)."""
    if min(config.repeats, config.new_task_repeats, config.seeds_per_visit) < 1:
        raise ValueError(f"repeats, new_task_repeats and seeds_per_visit must be >= 1, got {config.repeats}, "
                         f"{config.new_task_repeats}, {config.seeds_per_visit}")  # fmt: skip
    if overlap := set(config.tasks) & set(config.new_tasks):
        raise ValueError(f"a task is demonstrated or new, not both: {sorted(overlap)}")
    new_tasks = set(config.new_tasks)
    for first in range(0, config.episodes_per_task, config.seeds_per_visit):
        for task in config.tasks + config.new_tasks:
            for index in range(first, min(first + config.seeds_per_visit, config.episodes_per_task)):
                for repeat in range(config.new_task_repeats if task in new_tasks else config.repeats):
                    yield index, task, repeat


def step_event(
    record: StepRecord, client_id: str, episode_id: str, task: str, seed: int, model_version: str
) -> StepEvent:
    """The StepEvent of one recorded step; the final one carries the loop's termination. Every field is set, but
    those tests/test_step_contract.py lists as left at their default."""
    decision = record.decision
    return StepEvent(
        event_id=new_event_id(),
        client_id=client_id,
        produced_at=time.time(),
        episode_id=episode_id,
        step=record.step,
        task=task,
        instruction=record.obs.instruction,
        screenshot=encode_png(record.obs.screenshot),
        thought=decision.thought,
        action=decision.action,
        model_version=model_version,
        verify=record.verify,
        reward=record.reward,
        done=record.done,
        behaviour_logprob=decision.logprob,
        inference_ms=record.think_ms,
        env_ms=record.act_ms,
        visual_tokens_total=int(decision.extras.get("visual_tokens_total", 0)),
        visual_tokens_kept=int(decision.extras.get("visual_tokens_kept", 0)),
        termination=record.termination,
        seed=seed,
        tokens=decision.tokens,
        token_logprobs=decision.token_logprobs,
        temperature=decision.sampling.temperature if decision.sampling else 0.0,
        top_k=decision.sampling.top_k if decision.sampling else 0,
        target_box=decision.target_box or (),
        teacher_action=record.teacher.action if record.teacher else None,
        teacher_thought=record.teacher.thought if record.teacher else "",
        teacher_box=(record.teacher.target_box or ()) if record.teacher else (),
        teacher_reason=record.teacher_reason,
    )


def step_publisher(
    publish: Callable[[StepEvent], None], client_id: str, episode_id: str, task: str, seed: int, model_version: str
) -> Callable[[StepRecord], None]:
    """The loop's on_step for one episode: publish the step, then observe its timings."""

    def on_step(record: StepRecord) -> None:
        publish(step_event(record, client_id, episode_id, task, seed, model_version))
        metrics.observe_decision(model_version, record.decision.extras, record.think_ms / 1000)
        for phase, ms in (("think", record.think_ms), ("act", record.act_ms), ("verify", record.verify_ms)):
            metrics.STEP_SECONDS.labels(phase).observe(ms / 1000)

    return on_step


def samples(policy: Policy, config: EdgeConfig, task: str = "") -> bool:
    """Whether two runs of one seed can differ: a model sampling at a temperature, as it always does on a new task
    (experts are scripted)."""
    return policy.version != "expert" and (config.temperature > 0 or task in config.new_tasks)


def exploration(config: EdgeConfig) -> Sampling:
    """The client's sampler, seeded from its id and seed so a rerun of a client explores alike."""
    return Sampling(config.temperature, config.top_k, seed=zlib.crc32(config.client_id.encode()) + config.seed)


def _policy_source(config: EdgeConfig, settings: Settings):
    """task -> Policy (None: nothing may act on it yet). Experts are per task; a model is one policy for all tasks,
    swapped between episodes."""
    if config.policy == "expert" and config.new_tasks:
        raise ValueError(f"the experts may not act on the new tasks {list(config.new_tasks)}: use policy 'model'")
    if config.policy == "expert":
        from edge_client.experts import expert_for

        return expert_for
    if config.policy != "model":
        raise ValueError(f"policy must be 'expert' or 'model', got {config.policy!r}")
    from edge_client.model_updates import ModelSwapper, ModelVersionWatcher
    from policy.runtime import load_policy
    from registry.channels import channel_for

    channel = config.channel or channel_for(config.client_id, settings.canary_fraction)

    swapper = ModelSwapper(
        ModelVersionWatcher(settings, config.client_id, channel),
        lambda path, version: load_policy(
            path, version, intra_op_threads=config.intra_op_threads, sampling=exploration(config)
        ),
        settings.keys_dir / "trusted" if settings.require_signed_models else None,
    )
    if config.bootstrap_expert:
        from edge_client.experts import expert_for

        def current_or_expert(task: str) -> Policy | None:
            """The newest version; before one, the expert of a demonstrated task, and nothing on a new one."""
            return swapper.maybe_swap(timeout_ms=100) or (None if task in config.new_tasks else expert_for(task))

        return current_or_expert

    deadline = time.monotonic() + config.wait_for_model_s
    while swapper.maybe_swap(timeout_ms=500) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no model version for channel {channel!r} after {config.wait_for_model_s} s")

    def current(_task: str) -> Policy:
        return swapper.maybe_swap()

    return current
