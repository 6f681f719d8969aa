"""The screen codec shared by the learner (torch) and the edge runtime (onnxruntime): what the model sees.

Torch-free: edge installs have numpy, pillow and onnxruntime only. An image is the (210, 160, 3) uint8 RGB
task area, given to the model as a (3, 210, 160) uint8 array; pixel normalisation,
(pixel - PIXEL_MEAN) / PIXEL_STD, happens inside the model graph (so the ONNX input stays uint8).
"""

from __future__ import annotations

import io
import typing

import numpy as np

from schemas.events import ActionType

SCREEN_H = 210
SCREEN_W = 160
PIXEL_MEAN = 127.5  # applied inside the model: (pixel - PIXEL_MEAN) / PIXEL_STD
PIXEL_STD = 64.0

ACTION_TYPES: tuple[str, ...] = ("click", "type", "key", "scroll", "noop")
POSITIONAL_TYPES: frozenset[str] = frozenset({"click", "scroll"})  # action types whose (x, y) is a target
assert set(ACTION_TYPES) == set(typing.get_args(ActionType)), "ACTION_TYPES drifted from schemas.ActionType"


def decode_png(png: bytes) -> np.ndarray:
    """PNG bytes -> (H, W, 3) uint8 RGB."""
    from PIL import Image  # pillow is an edge dependency; imported lazily to keep import cheap

    with Image.open(io.BytesIO(png)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def screenshot_to_chw(screenshot: np.ndarray) -> np.ndarray:
    """(210, 160, 3|4) uint8 HWC -> (3, 210, 160) uint8 CHW (alpha dropped). Raises on any other size."""
    arr = np.asarray(screenshot)
    if arr.ndim != 3 or arr.shape[:2] != (SCREEN_H, SCREEN_W) or arr.shape[2] not in (3, 4):
        raise ValueError(f"screenshot must be ({SCREEN_H}, {SCREEN_W}, 3) uint8, got {arr.shape} {arr.dtype}")
    if arr.dtype != np.uint8:
        raise ValueError(f"screenshot must be uint8, got {arr.dtype}")
    return np.ascontiguousarray(arr[:, :, :3].transpose(2, 0, 1))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis (float64)."""
    z = logits.astype(np.float64) - np.max(logits, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def encode_png(screenshot: np.ndarray) -> bytes:
    """(H, W, 3) uint8 RGB -> PNG bytes (the inverse of decode_png)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(screenshot, dtype=np.uint8)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
