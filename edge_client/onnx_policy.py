"""The small pixel policy at the edge: onnxruntime only, no torch.

The ONNX file written by `learner.export.export_onnx` carries its PolicyConfig as JSON in the model
metadata (key `flywheel.policy_config`), so this class needs nothing but the file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_client.policy import Decision, Observation
from edge_client.preprocess import (
    ACTION_TYPES,
    POSITIONAL_TYPES,
    GreedyAction,
    Grid,
    decode_greedy,
    prepare_inputs,
)
from schemas import Action

CONFIG_METADATA_KEY = "flywheel.policy_config"
ACTIONS_METADATA_KEY = "flywheel.action_types"


def make_decision(g: GreedyAction, inference_ms: float = 0.0) -> Decision:
    """GreedyAction -> Decision with a short template thought and the expectation that verify checks."""
    x, y = round(g.x, 1), round(g.y, 1)
    extras = {"inference_ms": inference_ms, "type_logprob": g.type_logprob, "cell_logprob": g.cell_logprob}
    if g.action_type in POSITIONAL_TYPES:
        verb = "clicking" if g.action_type == "click" else "scrolling"
        return Decision(
            thought=f"Target looks like cell ({g.row},{g.col}); {verb} at ({x:g},{y:g}).",
            action=Action(g.action_type, x=x, y=y),
            expected=f"screen changes near ({x:g}, {y:g})",
            logprob=g.logprob,
            extras=extras,
        )
    # This model has no text / key head: type and key actions carry empty text (a later VLA writes them).
    return Decision(
        thought=f"No click target; choosing {g.action_type}.",
        action=Action(g.action_type),
        expected="" if g.action_type == "noop" else "screen changes",
        logprob=g.logprob,
        extras=extras,
    )


class OnnxPolicy:
    """Policy protocol over an exported PixelPolicy: preprocess -> onnxruntime -> greedy argmax -> Decision."""

    def __init__(self, path: str | Path, version: str, intra_op_threads: int = 1):
        self.version = version
        self.path = Path(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.path), sess_options=opts, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        if CONFIG_METADATA_KEY not in meta:
            raise ValueError(f"{self.path} has no {CONFIG_METADATA_KEY} metadata; export it with learner.export")
        actions = tuple(json.loads(meta.get(ACTIONS_METADATA_KEY, json.dumps(ACTION_TYPES))))
        if actions != ACTION_TYPES:
            raise ValueError(f"{self.path} was exported for action types {actions}, this client has {ACTION_TYPES}")
        self.config: dict = json.loads(meta[CONFIG_METADATA_KEY])
        self.grid = Grid(int(self.config["cell_px"]))
        self.max_len = int(self.config["max_instruction_bytes"])

    def run(self, screenshot: np.ndarray, instruction: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw outputs for one observation: type logits (T,), cell logits (G,), cell offsets (G, 2)."""
        inputs = prepare_inputs(screenshot, instruction, self.max_len)
        type_logits, cell_logits, cell_offsets = self.session.run(None, inputs)
        return type_logits[0], cell_logits[0], cell_offsets[0]

    def greedy(self, screenshot: np.ndarray, instruction: str) -> GreedyAction:
        return decode_greedy(*self.run(screenshot, instruction), self.grid)

    def act(self, obs: Observation) -> Decision:
        t0 = time.perf_counter()
        g = self.greedy(obs.screenshot, obs.instruction)
        return make_decision(g, (time.perf_counter() - t0) * 1e3)
