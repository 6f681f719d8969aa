"""Our actions and episode endings in miniwob's terms: an Action as miniwob's action dict (a key miniwob cannot press
becomes its no-op, with the reason), and miniwob's step metadata as StepResult.info. Shared by the fast env
(edge_client.env) and the stock gymnasium loop (edge_client.stock_env), so both translate alike."""

from __future__ import annotations

from typing import Any

import numpy as np
from miniwob.action import ActionSpaceConfig, ActionTypes
from miniwob.constants import DEFAULT_SCROLL_AMOUNT, TASK_HEIGHT, TASK_WIDTH

from schemas import Action


def to_miniwob(action: Action, config: ActionSpaceConfig) -> tuple[dict[str, Any], str | None]:
    """(miniwob action, None), or (its no-op, why) for a key miniwob cannot press: a model may emit one,
    and that step is wasted, not a crash."""
    try:
        return _miniwob_action(action, config), None
    except ValueError as exc:
        return _noop(config), str(exc)


def _miniwob_action(action: Action, config: ActionSpaceConfig) -> dict[str, Any]:
    # Selenium refuses pointer moves outside the viewport; keep clicks inside the task area.
    coords = np.array(
        [min(max(action.x, 0.0), TASK_WIDTH - 1.0), min(max(action.y, 0.0), TASK_HEIGHT - 1.0)],
        dtype=np.float32,
    )
    if action.type == "click":
        return {"action_type": config.action_types.index(ActionTypes.CLICK_COORDS), "coords": coords}
    if action.type == "type":
        return {"action_type": config.action_types.index(ActionTypes.TYPE_TEXT), "text": action.text}
    if action.type == "key":
        key = _key_index(config, action.key)
        return {"action_type": config.action_types.index(ActionTypes.PRESS_KEY), "key": key}
    if action.type == "scroll":
        kind = ActionTypes.SCROLL_DOWN_COORDS if action.scroll_dy >= 0 else ActionTypes.SCROLL_UP_COORDS
        # One shared config: the amount of this scroll is set on it just before the step.
        config.scroll_amount = int(round(abs(action.scroll_dy))) or DEFAULT_SCROLL_AMOUNT
        return {"action_type": config.action_types.index(kind), "coords": coords}
    return _noop(config)


def _noop(config: ActionSpaceConfig) -> dict[str, Any]:
    return {"action_type": config.action_types.index(ActionTypes.NONE)}


def step_info(done: bool, meta: dict[str, Any], env_ms: float, invalid: str | None) -> dict[str, Any]:
    """StepResult.info from miniwob's step metadata."""
    reason = meta.get("reason")
    return {
        "termination": _termination(done, reason),
        "reason": None if reason is None else str(reason),
        "raw_reward": float(meta.get("raw_reward", 0.0)),
        "env_reward": float(meta.get("env_reward", 0.0)),
        "elapsed_s": float(meta.get("elapsed", 0.0)),
        "env_ms": env_ms,
        "invalid_action": invalid,
    }


def _key_index(config: ActionSpaceConfig, key: str) -> int:
    """Index of `key` in miniwob's allowed keys; accepts 'Enter' for '<Enter>'."""
    for candidate in (key, f"<{key}>"):
        if candidate in config.allowed_keys:
            return list(config.allowed_keys).index(candidate)
    raise ValueError(f"key {key!r} is not one of miniwob's allowed keys (e.g. '<Enter>', 'a', 'C-a')")


def _termination(done: bool, reason: Any) -> str | None:
    """None while the episode runs; 'timeout' when the JS timer ended it; otherwise 'done'."""
    if not done:
        return None
    return "timeout" if reason == "timed out" else "done"
