"""Synthetic steps shaped like an edge client's: the pipeline and maintenance benchmarks' load.

Screens are 160x210 PNGs drawn like MiniWoB task areas (~5 KB, encoded by the edge's own encoder); a step is
a full StepEvent of a click-button episode, so every byte the pipeline handles is what a fleet would send.
"""

from __future__ import annotations

import random
import time

from schemas import Action, StepEvent, Verify, new_event_id


def render_screens(count: int = 48, seed: int = 0) -> list[bytes]:
    """PNG screenshots shaped like MiniWoB's 160x210 task area: a yellow instruction bar with text, then
    buttons, text fields and shapes on white, encoded the way edge clients encode them."""
    import numpy as np
    from PIL import Image, ImageDraw

    from policy.screen import SCREEN_H, SCREEN_W, encode_png

    rng = random.Random(seed)
    words = ["Click", "the", "button", "Submit", "OK", "Enter", "text", "color", "dialog", "link", "focus", "shape"]
    screens = []
    for _ in range(count):
        img = Image.new("RGB", (SCREEN_W, SCREEN_H), "white")
        draw = ImageDraw.Draw(img)
        draw.rectangle([0, 0, SCREEN_W, 50], fill=(255, 255, 200))
        for line in range(3):
            draw.text((4, 4 + 14 * line), " ".join(rng.choice(words) for _ in range(4)), fill="black")
        for _ in range(rng.randint(2, 6)):
            x, y = rng.randint(2, 110), rng.randint(55, 185)
            w, h = rng.randint(25, 48), rng.randint(14, 24)
            colour = tuple(rng.randint(60, 240) for _ in range(3))
            draw.rectangle([x, y, x + w, y + h], fill=colour, outline="black")
            draw.text((x + 3, y + 3), rng.choice(words), fill="black")
        for _ in range(rng.randint(0, 3)):
            x, y, r = rng.randint(10, 150), rng.randint(60, 200), rng.randint(4, 12)
            draw.ellipse([x - r, y - r, x + r, y + r], fill=tuple(rng.randint(0, 255) for _ in range(3)))
        screens.append(encode_png(np.asarray(img)))  # the edge clients' own encoder
    return screens


def bench_step(screens: list[bytes], client: str, episode: int, step: int, steps_per_episode: int) -> StepEvent:
    """An expert's step of a synthetic episode; the fields it leaves at their default are listed, with why, in
    tests/test_step_contract.py."""
    done = step == steps_per_episode - 1
    return StepEvent(
        event_id=new_event_id(),
        client_id=client,
        produced_at=time.time(),
        episode_id=f"{client}-click-button-{episode}-{episode}",
        step=step,
        task="click-button",
        instruction='Click on the "Submit" button.',
        screenshot=screens[(episode * steps_per_episode + step) % len(screens)],
        thought="The Submit button is near the middle of the screen; click it.",
        action=Action("click", 12.0 + 7 * step, 80.0 + 3 * step),
        model_version="expert",
        verify=Verify("screen changes near the click", "screen changed near the click", True),
        reward=1.0 if done else 0.0,
        done=done,
        termination="success" if done else None,
        seed=episode,
        behaviour_logprob=-0.25,
        inference_ms=18.0,
        env_ms=35.0,
        visual_tokens_total=420,
        visual_tokens_kept=105,
    )
