"""verify: expectations checked against synthetic screenshots (no browser)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.verify import changed_mask, changed_near, describe_change, verify
from policy.expectations import EXPECT_CHANGE, EXPECT_SUCCESS, expect_change_near, expect_text
from schemas import Action

H, W = 210, 160
CLICK = Action(type="click", x=80, y=100)
TYPE = Action(type="type", text="Agustina")


def blank() -> np.ndarray:
    return np.full((H, W, 3), 255, dtype=np.uint8)


def with_patch(x0: int, y0: int, x1: int, y1: int, value: int = 0) -> np.ndarray:
    """A white screen with a filled rectangle [x0, x1) x [y0, y1)."""
    img = blank()
    img[y0:y1, x0:x1] = value
    return img


def test_changed_mask_ignores_small_differences_and_uint8_wraparound() -> None:
    before = blank()
    after = blank()
    after[0, 0] = 255 - 10  # below the threshold
    after[1, 1] = 0  # 255 -> 0: must not wrap around to a small difference
    mask = changed_mask(before, after)
    assert mask.shape == (H, W)
    assert not mask[0, 0]
    assert mask[1, 1]
    assert mask.sum() == 1


def test_changed_mask_rejects_different_shapes() -> None:
    with pytest.raises(ValueError, match="shape"):
        changed_mask(blank(), np.zeros((10, 10, 3), dtype=np.uint8))


def test_changed_near_counts_only_the_square_around_the_point() -> None:
    mask = changed_mask(blank(), with_patch(70, 90, 90, 110))  # 20x20 = 400 px around (80, 100)
    assert changed_near(mask, 80, 100, radius=20) == 400
    assert changed_near(mask, 10, 10, radius=20) == 0
    # The square is clipped at the border instead of wrapping or failing.
    assert changed_near(mask, 0, 0, radius=5) == 0
    assert changed_near(mask, 500, 500, radius=5) == 0


def test_click_that_changes_the_screen_near_the_point_is_ok() -> None:
    expected = expect_change_near(80, 100)
    result = verify(blank(), with_patch(75, 95, 85, 105), CLICK, expected)
    assert result.expected == "screen changes near (80, 100)"
    assert result.ok is True
    assert "near (80, 100)" in result.observed
    assert "100 px there" in result.observed


def test_click_whose_change_is_elsewhere_is_not_ok() -> None:
    result = verify(blank(), with_patch(0, 0, 20, 20), CLICK, expect_change_near(80, 100))
    assert result.ok is False
    assert "but not near (80, 100)" in result.observed


def test_unchanged_screen_is_reported_as_such() -> None:
    result = verify(blank(), blank(), CLICK, expect_change_near(80, 100))
    assert result.ok is False
    assert result.observed == "screen unchanged"


def test_expected_success_but_episode_continues() -> None:
    result = verify(blank(), with_patch(75, 95, 85, 105), CLICK, EXPECT_SUCCESS)
    assert result.ok is False
    assert result.observed.startswith("episode continues; ")


@pytest.mark.parametrize(
    ("expected", "reward", "ok"),
    [
        (EXPECT_SUCCESS, 1.0, True),
        (EXPECT_SUCCESS, -1.0, False),
        (EXPECT_SUCCESS, 0.4, True),  # partial reward still counts as success (raw reward > 0)
        (expect_change_near(80, 100), 1.0, True),
        (expect_change_near(80, 100), -1.0, False),
        ("", -1.0, None),  # nothing checkable was expected
    ],
)
def test_ended_episode_is_judged_by_its_reward(expected: str, reward: float, ok: bool | None) -> None:
    black = np.zeros((H, W, 3), dtype=np.uint8)  # miniwob's screen after the episode ends
    result = verify(blank(), black, CLICK, expected, done=True, reward=reward)
    assert result.observed == f"episode ended with reward {reward:g}"
    assert result.ok is ok


def test_typing_is_checked_by_any_change() -> None:
    expected = expect_text("Agustina")
    assert expected == "text 'Agustina' appears"
    assert verify(blank(), with_patch(5, 60, 60, 70), TYPE, expected).ok is True
    unchanged = verify(blank(), blank(), TYPE, expected)
    assert unchanged.ok is False
    assert unchanged.observed == "screen unchanged"


def test_any_change_expectation() -> None:
    assert verify(blank(), with_patch(0, 0, 3, 3), Action(type="key", key="<Enter>"), EXPECT_CHANGE).ok is True
    assert verify(blank(), blank(), Action(type="key", key="<Enter>"), EXPECT_CHANGE).ok is False


def test_free_text_expectation_is_not_checkable_but_described() -> None:
    result = verify(blank(), with_patch(75, 95, 85, 105), CLICK, "button ONE takes the click")
    assert result.ok is None
    # A click's own point is used to say where the change was.
    assert "near (80, 100)" in result.observed


def test_describe_change_reports_share_of_screen() -> None:
    mask = changed_mask(blank(), with_patch(0, 0, 160, 21))  # 160*21 / (160*210) = 10%
    assert describe_change(mask, None) == "3360 px (10.0%) of the screen changed"
