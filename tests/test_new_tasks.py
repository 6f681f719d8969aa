"""Tasks nobody demonstrated: what the tables prove was (not) supplied on them, and their figures by group."""

from __future__ import annotations

import polars as pl
from miniwob.dom import DOMElement

from edge_client.audit import element_under
from flywheel.gathering.evaluation import paired_by_group
from lake.queries import supervision_on
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, table_uri


def write(tables, name: str, rows: list[dict]) -> None:
    pl.DataFrame(rows).write_delta(str(table_uri(tables, name)), mode="append")


def step(task: str, version: str = "v1", label: str | None = None, box: list[float] | None = None) -> dict:
    return {"task": task, "model_version": version, "teacher_action_type": label, "target_box": box or []}


def test_the_tables_prove_a_new_task_had_no_expert_label_box_or_demonstration_and_name_what_leaked(tmp_path):
    write(
        tmp_path,
        STEPS,
        [
            step("click-menu"),
            step("click-menu"),
            step("click-pie"),
            step("click-test", "expert", box=[1, 2, 3, 4]),
            step("click-test", label="click"),
        ],
    )
    write(
        tmp_path,
        EPISODES,
        [
            {"task": "click-menu", "success": True},
            {"task": "click-menu", "success": False},
            {"task": "click-pie", "success": False},
            {"task": "click-test", "success": True},
        ],
    )
    write(tmp_path, TRAINING_SAMPLES, [{"task": "click-test", "purpose": "demo"},
                                       {"task": "click-menu", "purpose": "success"}])  # fmt: skip
    counts = supervision_on(tmp_path, ("click-menu", "click-pie", "count-sides"))
    assert counts["click-menu"] == {"steps": 2, "episodes": 2, "successes": 1, "expert_steps": 0,
                                    "teacher_labels": 0, "target_boxes": 0, "demo_rows": 0}  # fmt: skip
    assert counts["count-sides"]["steps"] == 0  # never run: all zeros, not missing

    # The same query on a task that had them counts each kind (the check can fail).
    known = supervision_on(tmp_path, ("click-test",))["click-test"]
    assert (known["expert_steps"], known["teacher_labels"], known["target_boxes"], known["demo_rows"]) == (1, 1, 1, 1)


def test_paired_figures_by_group_keep_the_new_tasks_apart_from_the_demonstrated_ones():
    last = {"success_by_seed": {"a": [True, True], "b": [True, False], "n": [True, True]}}
    first = {"success_by_seed": {"a": [True, True], "b": [True, False], "n": [False, False]}}
    groups = paired_by_group(last, first, {"suite": ("a", "b"), "new": ("n",), "absent": ("z",)})
    assert groups["suite"]["diff"] == 0.0 and groups["suite"]["after"] == 0.75 and groups["suite"]["tasks"] == 2
    assert groups["new"] == {"after": 1.0, "before": 0.0, "diff": 1.0, "ci": [1.0, 1.0], "tasks": 1}
    assert "absent" not in groups


def test_the_audit_counts_a_click_on_the_pages_containers_as_a_click_on_nothing():
    def node(tag, left, top, width, height, ref, id="", children=()):
        return {"tag": tag, "left": left, "top": top, "width": width, "height": height, "ref": ref, "id": id,
                "classes": "", "children": list(children)}  # fmt: skip

    page = DOMElement(node("body", 0, 0, 160, 210, 1, children=[
        node("div", 0, 0, 160, 210, 2, "wrap", [node("div", 0, 0, 160, 50, 3, "query"),
                                                 node("div", 0, 50, 160, 160, 4, "area", [
                                                     node("button", 20, 170, 20, 20, 5, "b3")])])]))  # fmt: skip
    assert element_under(page, 30, 180)  # the button
    assert not element_under(page, 100, 120)  # the task area's own background
    assert not element_under(page, 80, 25)  # the instruction
    assert not element_under(None, 30, 180)  # the episode had ended


def test_a_group_of_unequal_lengths_is_compared_on_the_seeds_both_ran():
    greedy_last = {"success_by_seed": {"n": [True, False, True, True]}}  # 4 held-out seeds
    best_of_k_first = {"success_by_seed": {"n": [False, False]}}  # its first 2, K tries each
    paired = paired_by_group(greedy_last, best_of_k_first, {"new": ("n",)})["new"]
    assert (paired["after"], paired["before"], paired["diff"]) == (0.5, 0.0, 0.5)
