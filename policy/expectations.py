"""The expectation vocabulary: what a policy writes after acting, so edge_client.verify can check it.

Short strings a model can write and a checker can read (edge_client.verify explains what each checks).
"""

from __future__ import annotations

EXPECT_SUCCESS = "episode ends with success"
EXPECT_CHANGE = "screen changes"


def expect_change_near(x: float, y: float) -> str:
    return f"screen changes near ({round(x)}, {round(y)})"


def expect_text(text: str) -> str:
    return f"text '{text}' appears"
