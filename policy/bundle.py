"""The `.vla` bundle: the one file a model version is, written by the learner and read by the edge.

A zip of
    encoder.onnx, prefill.onnx, decode.onnx   the graphs (learner.model.export builds them)
    weights.bin                               their shared external data, each distinct tensor once
    wte.npy                                   (V, d) token embeddings, looked up by the runtime per decode step
    tokenizer.json                            the locally trained tokenizer (policy.tokens)
    vla.json                                  {"format", "model_config", "pruning", "quantized"}
Its sha256 is what a ModelVersionEvent names, so writing is deterministic: members sorted, fixed timestamps.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

from core.settings import get_settings

BUNDLE_FORMAT = "flywheel-vla/3"  # 3: prefill + decode graphs, the cache appended to in place
GRAPHS = ("encoder.onnx", "prefill.onnx", "decode.onnx")
WEIGHTS = "weights.bin"
META = "vla.json"
REQUIRED = (*GRAPHS, WEIGHTS, "wte.npy", "tokenizer.json", META)
MAX_MEMBERS = 64  # a bundle has 7; its bytes are bounded by settings.max_model_bytes


class BundleError(ValueError):
    """A file that is not a bundle this code can run; the message names the file and what is wrong with it."""


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


def read_members(path: str | Path, max_bytes: int | None = None) -> dict[str, bytes]:
    """Every member, checked only as a zip (its size, its members' declared sizes, their CRCs): BundleError
    otherwise. For rewriting a bundle (quantising it) and as the first step of read_bundle. `max_bytes` bounds the
    file and its inflated members (default settings.max_model_bytes): refused before it is inflated in memory."""
    path, max_bytes = Path(path), max_bytes or get_settings().max_model_bytes
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise BundleError(f"{path}: {size} bytes, over the {max_bytes}-byte bound of a bundle")
        if not zipfile.is_zipfile(path):
            raise BundleError(f"{path}: not a .vla bundle (not a zip file)")
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise BundleError(f"{path}: {len(infos)} members, a bundle has at most {MAX_MEMBERS}")
            inflated = sum(info.file_size for info in infos)
            if inflated > max_bytes:  # a zip bomb: its header says how big it will get, before we inflate it
                raise BundleError(f"{path}: members inflate to {inflated} bytes, over the bound of {max_bytes}")
            return {info.filename: _read_member(zf, info) for info in infos}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as error:
        raise BundleError(f"{path}: unreadable bundle: {error}") from error


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    # Read no more than the header declares: a member whose stream runs longer is a lie, not a bigger model.
    with zf.open(info) as member:
        data = member.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise BundleError(f"member {info.filename}: {len(data)} bytes where its header says {info.file_size}")
    return data


def read_bundle(path: str | Path, max_bytes: int | None = None) -> tuple[dict, dict[str, bytes]]:
    """(vla.json, members) of a bundle this code can run; BundleError naming what is wrong for anything else."""
    members = read_members(path, max_bytes)
    try:
        meta = json.loads(members[META]) if META in members else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{path}: {META} is not JSON: {error}") from error
    if not isinstance(meta, dict) or meta.get("format") != BUNDLE_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise BundleError(f"{path}: bundle format {found!r}, this client reads {BUNDLE_FORMAT!r}")
    missing = [name for name in REQUIRED if name not in members]
    if missing:
        raise BundleError(f"{path}: bundle lacks {', '.join(missing)}")
    if not isinstance(meta.get("model_config"), dict) or not isinstance(meta.get("pruning"), dict):
        raise BundleError(f"{path}: {META} lacks its model_config or pruning object")
    return meta, members
