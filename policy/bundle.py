"""The `.vla` bundle: the one file a model version is, written by the learner and read by the edge.

A zip of
    encoder.onnx, prefill.onnx, decode.onnx   the graphs (learner.vla_export builds them)
    weights.bin                               their shared external data, each distinct tensor once
    wte.npy                                   (V, d) token embeddings, looked up by the runtime per decode step
    tokenizer.json                            the locally trained tokenizer (policy.tokens)
    vla.json                                  {"format", "model_config", "pruning", "quantized"}
Its sha256 is what a ModelVersionEvent names, so writing is deterministic: members sorted, fixed timestamps.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

BUNDLE_FORMAT = "flywheel-vla/3"  # 3: prefill + decode graphs, the cache appended to in place
GRAPHS = ("encoder.onnx", "prefill.onnx", "decode.onnx")
WEIGHTS = "weights.bin"
META = "vla.json"
REQUIRED = (*GRAPHS, WEIGHTS, "wte.npy", "tokenizer.json", META)


def write_bundle(path: str | Path, members: dict[str, bytes]) -> Path:
    """Write the members atomically; the same members give the same bytes (so the same sha256)."""
    missing = [name for name in REQUIRED if name not in members]
    if missing:
        raise ValueError(f"a bundle needs {', '.join(missing)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, members[name])
    tmp.replace(path)
    return path


def read_members(path: str | Path) -> dict[str, bytes]:
    """Every member, unchecked (for rewriting a bundle, e.g. quantising it)."""
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def read_bundle(path: str | Path) -> tuple[dict, dict[str, bytes]]:
    """(vla.json, members) of a bundle this code can run; a clear error for anything else."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a .vla bundle (not a zip file)")
    members = read_members(path)
    meta = json.loads(members[META]) if META in members else {}
    if meta.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path}: bundle format {meta.get('format')!r}, this client reads {BUNDLE_FORMAT!r}")
    missing = [name for name in REQUIRED if name not in members]
    if missing:
        raise ValueError(f"{path}: bundle lacks {', '.join(missing)}")
    return meta, members
