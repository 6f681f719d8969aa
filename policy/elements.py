"""Click candidates read from the pixels alone: the screen's distinct elements.

A policy trained on other tasks puts almost no click mass on what it never learned to want: on count-sides the
release's click map scores its five answer buttons at log-probability -24 and below, so sampling (even at
temperature 3) and the map's own peaks never try them. The screen itself shows where the things to press are:
regions that differ from the background. This finds them without the DOM, as a person scanning a new app would:

    background  = the screen's most common colour
    foreground  = the cells (CELL_PX square) holding a pixel that differs from it by more than TOLERANCE
    elements    = 4-connected groups of foreground cells (a word's glyphs, an icon: one group each, since CELL_PX
                  bridges the gaps inside them), each clicked at its box's centre; centres within SAME_PX of
                  one already found (a button's frame around its label) are the same element

Groups larger than MAX_AREA of the screen (a banner, a page-wide panel) are not one thing to press; their
centre is still offered last, since a click there is cheap to try. The order is top to bottom, left to right.
"""

from __future__ import annotations

import numpy as np

CELL_PX = 2  # gaps this narrow join: the glyphs of a word, a frame and its label; buttons 3 px apart stay apart
TOLERANCE = 24  # colour levels (of 255) a pixel may differ from the background and still be background
MAX_AREA = 0.2  # a group covering more of the screen than this (a banner: 160 x 50 px, 0.24) is a region
SAME_PX = 4.0  # centres this close (in x and in y) are one element's (a button's frame and its label)


def element_centres(screenshot: np.ndarray) -> list[tuple[float, float]]:
    """(x, y) pixel centres of the screen's elements, elements first (top to bottom, left to right), then the
    oversized regions; `screenshot` is (H, W, 3) uint8."""
    height, width = screenshot.shape[:2]
    colours, counts = np.unique(screenshot.reshape(-1, 3), axis=0, return_counts=True)
    background = colours[counts.argmax()].astype(np.int16)
    differs = (np.abs(screenshot.astype(np.int16) - background) > TOLERANCE).any(axis=-1)  # (H, W)
    rows, cols = height // CELL_PX, width // CELL_PX
    cells = differs[: rows * CELL_PX, : cols * CELL_PX].reshape(rows, CELL_PX, cols, CELL_PX).any(axis=(1, 3))
    elements, regions = [], []
    for group in connected_groups(cells):
        ys, xs = zip(*group, strict=True)
        centre = ((min(xs) + max(xs) + 1) * CELL_PX / 2, (min(ys) + max(ys) + 1) * CELL_PX / 2)
        (regions if len(group) > MAX_AREA * rows * cols else elements).append(centre)
    by_reading_order = lambda c: (c[1], c[0])  # noqa: E731
    distinct: list[tuple[float, float]] = []
    for x, y in sorted(elements, key=by_reading_order) + sorted(regions, key=by_reading_order):
        if all(abs(x - a) > SAME_PX or abs(y - b) > SAME_PX for a, b in distinct):  # a frame and its label: one
            distinct.append((x, y))
    return distinct


def connected_groups(cells: np.ndarray) -> list[list[tuple[int, int]]]:
    """The 4-connected groups of True cells of a (R, C) bool grid, each a list of (row, col)."""
    seen = np.zeros_like(cells, dtype=bool)
    groups = []
    for start in zip(*np.nonzero(cells), strict=True):
        if seen[start]:
            continue
        seen[start] = True
        group, frontier = [], [start]
        while frontier:
            r, c = frontier.pop()
            group.append((int(r), int(c)))
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= nr < cells.shape[0] and 0 <= nc < cells.shape[1] and cells[nr, nc] and not seen[nr, nc]:
                    seen[nr, nc] = True
                    frontier.append((nr, nc))
        groups.append(group)
    return groups
