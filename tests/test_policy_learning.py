"""The small pixel policy learns a synthetic click task; ONNX export and the edge OnnxPolicy agree with torch.

Synthetic screens: three squares of distinct colours on white; "Click on the <colour> square" targets one of
them; a few "Do nothing." rows target noop. No browser, no hub, a tiny model trained for ~2 k samples.
"""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from PIL import Image

from edge_client.onnx_policy import OnnxPolicy
from edge_client.policy import Observation
from edge_client.preprocess import (
    ACTION_TYPES,
    Grid,
    decode_greedy,
    decode_png,
    encode_instruction,
    encode_target,
    prepare_inputs,
)
from learner.export import export_onnx
from learner.model import (
    PixelPolicy,
    PolicyConfig,
    PolicyOutput,
    TorchPolicy,
    action_logprob,
    greedy,
    load_model,
)
from learner.sft import SFTConfig, SFTTargets, sft_loss, train_sft

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
TINY = PolicyConfig(
    stem_channels=8, channels=16, num_blocks=2, groups=4, byte_embed_dim=16, text_channels=32, type_hidden=32
)
SFT = SFTConfig(steps=120, batch_size=16, lr=5e-3, warmup_steps=20, seed=0, num_threads=2, log_every=20)
NOOP_INSTRUCTION = "Do nothing."


def make_screen(rng: np.random.Generator) -> tuple[np.ndarray, str, tuple[int, int, int]]:
    """(210,160,3) uint8 screen with 3 non-overlapping coloured squares; instruction; target box (x0, y0, side)."""
    img = np.full((210, 160, 3), 255, np.uint8)
    names = rng.choice(list(COLOURS), size=3, replace=False)
    boxes: list[tuple[int, int, int]] = []
    while len(boxes) < 3:
        s = int(rng.integers(14, 21))
        x0, y0 = int(rng.integers(0, 160 - s)), int(rng.integers(0, 210 - s))
        if all(x0 + s + 2 < bx or bx + bs + 2 < x0 or y0 + s + 2 < by or by + bs + 2 < y0 for bx, by, bs in boxes):
            boxes.append((x0, y0, s))
    for (x0, y0, s), name in zip(boxes, names, strict=True):
        img[y0 : y0 + s, x0 : x0 + s] = COLOURS[name]
    k = int(rng.integers(3))
    return img, f"Click on the {names[k]} square", boxes[k]


def to_png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def make_frame(n: int, seed: int, noop_every: int = 10) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        img, instruction, (x0, y0, s) = make_screen(rng)
        if noop_every and i % noop_every == 0:
            instruction, action, x, y = NOOP_INSTRUCTION, "noop", 0.0, 0.0
        else:
            action, x, y = "click", x0 + s / 2, y0 + s / 2
        rows.append(dict(screenshot=to_png(img), instruction=instruction, action_type=action, x=x, y=y))
    return pl.DataFrame(rows).with_columns(weight=pl.lit(1.0))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    frame = make_frame(400, seed=1)
    progress = []
    result = train_sft(frame, SFT, tmp_path_factory.mktemp("sft"), model_config=TINY, progress=progress.append)
    return result, progress


@pytest.fixture(scope="module")
def held_out():
    rng = np.random.default_rng(12345)
    return [make_screen(rng) for _ in range(60)]


def test_loss_falls_and_progress_reported(trained):
    result, progress = trained
    assert len(result.losses) == SFT.steps and result.steps == SFT.steps and result.start_step == 0
    first, last = np.mean(result.losses[:10]), np.mean(result.losses[-10:])
    assert last < 0.5 * first, (first, last)
    assert [p.step for p in progress] == list(range(20, SFT.steps + 1, 20))
    assert result.samples_per_s > 0 and result.checkpoint_path.exists()


def test_parameters_changed_from_seeded_init(trained):
    result, _ = trained
    torch.manual_seed(SFT.seed)
    init = PixelPolicy(TINY)  # train_sft builds its fresh model exactly like this
    changed = [name for name, p in result.model.named_parameters() if not torch.equal(p, init.state_dict()[name])]
    assert len(changed) == len(list(init.parameters()))


def test_click_accuracy_well_above_random(trained, held_out):
    model = trained[0].model
    inputs = [prepare_inputs(img, instruction, TINY.max_instruction_bytes) for img, instruction, _ in held_out]
    with torch.inference_mode():
        out = model(
            torch.from_numpy(np.concatenate([i["image"] for i in inputs])),
            torch.from_numpy(np.concatenate([i["instruction_ids"] for i in inputs])),
        )
    hits = 0
    for k, (_, _, (x0, y0, s)) in enumerate(held_out):
        g = decode_greedy(*(t[k].numpy() for t in out), TINY.grid)
        hits += g.action_type == "click" and x0 <= g.x < x0 + s and y0 <= g.y < y0 + s
    # Random: 1/3 when picking a square, ~1% when picking a pixel.
    assert hits / len(held_out) >= 0.7, hits


def test_type_head_learns_noop(trained, held_out):
    img = held_out[0][0]
    assert greedy(trained[0].model, img, NOOP_INSTRUCTION).action_type == "noop"
    decision = TorchPolicy(trained[0].model, "t").act(Observation("synthetic", NOOP_INSTRUCTION, img))
    assert decision.action.type == "noop" and decision.logprob is not None and decision.logprob <= 0


def test_onnx_export_matches_torch(trained, held_out, tmp_path):
    model = trained[0].model
    export = export_onnx(model, tmp_path / "policy.onnx")
    assert export.max_abs_diff < 1e-4 and len(export.sha256) == 64
    policy = OnnxPolicy(export.path, version="sft-test", intra_op_threads=1)
    for img, instruction, _ in held_out[:10]:
        inputs = prepare_inputs(img, instruction, TINY.max_instruction_bytes)
        with torch.inference_mode():
            want = model(torch.from_numpy(inputs["image"]), torch.from_numpy(inputs["instruction_ids"]))
        got = policy.run(img, instruction)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w[0].numpy(), atol=1e-4, rtol=1e-4)


def test_onnx_policy_greedy_equals_torch_greedy(trained, held_out, tmp_path):
    model = trained[0].model
    policy = OnnxPolicy(export_onnx(model, tmp_path / "policy.onnx").path, version="sft-test")
    assert policy.version == "sft-test"
    for img, instruction, _ in held_out[:10] + [(held_out[0][0], NOOP_INSTRUCTION, None)]:
        want = greedy(model, img, instruction)
        decision = policy.act(Observation("synthetic", instruction, img))
        assert decision.action.type == want.action_type
        assert decision.logprob == pytest.approx(want.logprob, abs=1e-3)
        if want.action_type == "click":
            assert decision.action.x == pytest.approx(want.x, abs=0.06)
            assert decision.action.y == pytest.approx(want.y, abs=0.06)
            assert decision.thought.startswith(f"Target looks like cell ({want.row},{want.col}); clicking at")
            assert decision.expected == f"screen changes near ({decision.action.x:g}, {decision.action.y:g})"


def test_behaviour_logprob_matches_action_logprob(trained, held_out):
    model = trained[0].model
    img, instruction, _ = held_out[0]
    g = greedy(model, img, instruction)
    inputs = prepare_inputs(img, instruction, TINY.max_instruction_bytes)
    with torch.inference_mode():
        out = model(torch.from_numpy(inputs["image"]), torch.from_numpy(inputs["instruction_ids"]))
    cell = torch.tensor([g.row * TINY.grid.cols + g.col])
    lp = action_logprob(out, torch.tensor([ACTION_TYPES.index(g.action_type)]), cell)
    assert float(lp[0]) == pytest.approx(g.logprob, abs=1e-4)


def test_resume_continues_exactly(tmp_path):
    frame = make_frame(40, seed=7)
    cfg = SFTConfig(steps=6, batch_size=4, lr=1e-3, warmup_steps=2, seed=3, num_threads=2)
    straight = train_sft(frame, cfg, tmp_path / "a", model_config=TINY)
    half = train_sft(frame, replace(cfg, steps=3), tmp_path / "b", model_config=TINY)
    resumed = train_sft(frame, cfg, tmp_path / "c", resume_from=half.checkpoint_path)
    assert resumed.start_step == 3 and len(resumed.losses) == 3
    np.testing.assert_allclose(half.losses + resumed.losses, straight.losses, rtol=1e-4, atol=1e-5)
    for name, p in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], p, rtol=1e-4, atol=1e-5)
    reloaded = load_model(resumed.checkpoint_path)
    assert reloaded.cfg == TINY


def test_sft_loss_is_the_weighted_formula():
    torch.manual_seed(0)
    grid = Grid(10)
    B, T, G = 3, len(ACTION_TYPES), grid.cells
    out = PolicyOutput(torch.randn(B, T), torch.randn(B, G), torch.rand(B, G, 2))
    tg = SFTTargets(
        action_type=torch.tensor([0, 4, 0]),
        cell=torch.tensor([5, 0, 100]),
        offset=torch.tensor([[0.2, 0.8], [0.5, 0.5], [0.0, 1.0]]),
        positional=torch.tensor([1.0, 0.0, 1.0]),
        weight=torch.tensor([1.0, 2.0, 0.0]),  # the third step is ignored
    )
    loss = sft_loss(out, tg, type_weight=1.0, cell_weight=2.0, offset_weight=0.5)
    tl = -out.type_logits.log_softmax(-1)
    cl = -out.cell_logits.log_softmax(-1)
    l0 = tl[0, 0] + 2.0 * cl[0, 5] + 0.5 * (out.cell_offsets[0, 5] - tg.offset[0]).abs().sum()
    l1 = tl[1, 4]
    assert float(loss.total) == pytest.approx(float((1.0 * l0 + 2.0 * l1) / 3.0), rel=1e-5)
    assert float(loss.cell_nll) == pytest.approx(float(cl[0, 5]), rel=1e-5)


def test_preprocess_roundtrip():
    ids = encode_instruction("Click 'é'", max_len=12)
    assert ids.shape == (12,) and ids.dtype == np.int64 and ids[0] == ord("C") + 1 and ids[-1] == 0
    assert encode_instruction("x" * 200, max_len=96).tolist() == [ord("x") + 1] * 96
    grid = Grid(10)
    t = encode_target("click", 37.0, 104.0, grid)
    assert t.positional and divmod(t.cell, grid.cols) == (10, 3) and t.offset == pytest.approx((0.7, 0.4))
    logits = np.full(grid.cells, -10.0)
    logits[t.cell] = 10.0
    offsets = np.zeros((grid.cells, 2))
    offsets[t.cell] = t.offset
    g = decode_greedy(np.array([5.0, 0, 0, 0, 0]), logits, offsets, grid)
    assert (g.action_type, g.x, g.y) == ("click", pytest.approx(37.0), pytest.approx(104.0))
    assert not encode_target("noop", 5, 5, grid).positional
    img = make_screen(np.random.default_rng(0))[0]
    assert np.array_equal(decode_png(to_png(img)), img)
    with pytest.raises(ValueError):
        prepare_inputs(np.zeros((100, 100, 3), np.uint8), "x")


def test_bad_frame_is_rejected(tmp_path):
    frame = make_frame(4, seed=0).with_columns(action_type=pl.lit("drag"))
    with pytest.raises(ValueError, match="drag"):
        train_sft(frame, SFTConfig(steps=1), tmp_path, model_config=TINY)
    with pytest.raises(ValueError, match="lacks columns"):
        train_sft(frame.drop("x"), SFTConfig(steps=1), tmp_path, model_config=TINY)


def test_edge_modules_do_not_import_torch():
    code = "import sys; sys.modules['torch'] = None; import edge_client.onnx_policy, edge_client.preprocess"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
