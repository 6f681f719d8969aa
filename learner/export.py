"""Export the pixel policy to ONNX (legacy TorchScript exporter, fixed opset) and verify it in onnxruntime.

Graph inputs:  image (B, 3, 210, 160) uint8, instruction_ids (B, L) int64  -- see edge_client.preprocess
Graph outputs: type_logits (B, 5), cell_logits (B, G), cell_offsets (B, G, 2)
Metadata:      flywheel.policy_config (PolicyConfig JSON), flywheel.action_types (JSON list)
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from edge_client.onnx_policy import ACTIONS_METADATA_KEY, CONFIG_METADATA_KEY
from edge_client.preprocess import ACTION_TYPES, SCREEN_H, SCREEN_W
from learner.model import PixelPolicy

OPSET = 17
INPUT_NAMES = ["image", "instruction_ids"]
OUTPUT_NAMES = ["type_logits", "cell_logits", "cell_offsets"]


@dataclass(frozen=True)
class OnnxExport:
    """What export_onnx wrote."""

    path: Path
    sha256: str  # of the .onnx file, for ModelVersionEvent.sha256
    bytes: int
    max_abs_diff: float  # torch vs onnxruntime on the verification batch


def export_onnx(
    model: PixelPolicy,
    path: str | Path,
    *,
    opset: int = OPSET,
    verify: bool = True,
    atol: float = 1e-4,
    seed: int = 0,
) -> OnnxExport:
    """Export `model` (on CPU, eval mode; the caller's model is not modified) to `path` and verify it.

    Verification: onnx.checker, then onnxruntime vs torch on a seeded random batch of 2; raises
    AssertionError if any output differs by more than `atol`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = copy.deepcopy(model).cpu().eval()
    cfg = net.cfg
    gen = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (2, 3, SCREEN_H, SCREEN_W), dtype=torch.uint8, generator=gen)
    ids = torch.randint(1, 128, (2, cfg.max_instruction_bytes), dtype=torch.int64, generator=gen)
    ids[1, cfg.max_instruction_bytes // 2 :] = 0  # one padded instruction
    dynamic = {name: {0: "batch"} for name in INPUT_NAMES + OUTPUT_NAMES}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            net,
            (image, ids),
            str(path),
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            dynamic_axes=dynamic,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    proto = onnx.load(str(path))
    metadata = {CONFIG_METADATA_KEY: json.dumps(cfg.to_dict()), ACTIONS_METADATA_KEY: json.dumps(ACTION_TYPES)}
    for key, value in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name = "flywheel.learner"
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))

    diff = 0.0
    if verify:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = session.run(None, {"image": image.numpy(), "instruction_ids": ids.numpy()})
        with torch.inference_mode():
            want = [t.numpy() for t in net(image, ids)]
        for name, g, w in zip(OUTPUT_NAMES, got, want, strict=True):
            assert g.shape == w.shape, f"{name}: onnxruntime shape {g.shape} != torch {w.shape}"
            diff = max(diff, float(np.max(np.abs(g - w))))
        assert diff <= atol, f"onnxruntime differs from torch by {diff:.2e} > {atol:.0e}"
    data = path.read_bytes()
    return OnnxExport(path=path, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), max_abs_diff=diff)
