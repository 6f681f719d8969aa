"""Training-time views of a screen, so the policy learns what is on it, not how one browser build drew it.

A view is one random affine warp (zoom about the centre, then a shift) plus a per-channel colour jitter,
applied to a step's screenshot and to its previous frame alike; the click target moves with the pixels
(its coordinate tokens are re-binned), so the label stays true. Zoom resamples bilinearly, which also
blurs glyph edges a little, as another font rasteriser would. numpy + pillow only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from policy.screen import SCREEN_H, SCREEN_W

BACKGROUND = (255, 255, 255)  # what a shift uncovers: MiniWoB's page is white
TRIES = 4  # views drawn before giving up on one that keeps the target on the screen


@dataclass(frozen=True)
class View:
    scale: float  # zoom about the screen centre
    dx: float  # then a shift, in pixels
    dy: float
    gain: np.ndarray  # (3,) per-channel multiplier
    offset: np.ndarray  # (3,) per-channel addend, 0-255 scale

    def point(self, x: float, y: float) -> tuple[float, float]:
        """Where pixel (x, y) of the original lands in the view."""
        cx, cy = SCREEN_W / 2, SCREEN_H / 2
        return self.scale * (x - cx) + cx + self.dx, self.scale * (y - cy) + cy + self.dy

    def apply(self, image: np.ndarray) -> np.ndarray:
        """(210, 160, 3) uint8 -> the same screen seen through this view, (210, 160, 3) uint8."""
        warped = image
        if self.scale != 1.0 or self.dx or self.dy:
            cx, cy, s = SCREEN_W / 2, SCREEN_H / 2, self.scale
            # PIL maps each output pixel back to its source: the inverse of View.point.
            inverse = (1 / s, 0.0, cx - (cx + self.dx) / s, 0.0, 1 / s, cy - (cy + self.dy) / s)
            warped = np.asarray(Image.fromarray(image).transform((SCREEN_W, SCREEN_H), Image.Transform.AFFINE,
                                inverse, resample=Image.Resampling.BILINEAR, fillcolor=BACKGROUND))  # fmt: skip
        return np.clip(warped * self.gain + self.offset, 0, 255).astype(np.uint8)


IDENTITY = View(1.0, 0.0, 0.0, np.ones(3, np.float32), np.zeros(3, np.float32))


def random_view(
    rng: np.random.Generator, shift_px: int, scale: float, colour: float, target: tuple[float, float] | None
) -> View:
    """A random view (shift up to +-shift_px each axis, zoom 1 +- scale, channel gain 1 +- colour and offset
    +- colour * 255) that keeps `target` (x, y) on the screen; the identity if none of TRIES draws does."""
    for _ in range(TRIES):
        view = View(
            scale=float(1.0 + rng.uniform(-scale, scale)),
            dx=float(rng.integers(-shift_px, shift_px + 1)),
            dy=float(rng.integers(-shift_px, shift_px + 1)),
            gain=(1.0 + rng.uniform(-colour, colour, 3)).astype(np.float32),
            offset=(255.0 * rng.uniform(-colour, colour, 3)).astype(np.float32),
        )
        if target is None:
            return view
        x, y = view.point(*target)
        if 0 <= x < SCREEN_W and 0 <= y < SCREEN_H:
            return view
    return IDENTITY
