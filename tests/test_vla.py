"""The VLA: tokens, pruning, loss, export with an explicit KV cache, onnxruntime = torch, LoRA, resume.

Data: real MiniWoB++ click-test / click-button screens with the DOM experts' thoughts and actions, taken
straight from the browser (the pipeline path is covered by the release smoke test). Models are tiny.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import torch

from edge_client.env import GuiEnv
from edge_client.experts import expert_for
from learner.algorithms.sft import is_map_only_step, train_vla
from learner.data.augment import random_view
from learner.data.dataset import TaskLossWeights, VLADataset, click_positives, tokenizer_corpus
from learner.model.checkpoints import load_vla
from learner.model.export import check_decoder_parity, export_bundle, quantize_bundle
from learner.model.infer import torch_step
from learner.model.lora import apply_lora, merge_lora
from learner.model.vla import VLA
from learner.model.vla_config import VLAConfig
from learner.model.vla_loss import target_patch_index, vla_loss
from learner.recipe import VLARecipe, VLATrainConfig
from policy.pruning import (
    ANCHOR,
    FLAT,
    MAP_TOP_CELLS,
    PruningConfig,
    anchor_mask,
    keep_count,
    patch_prior,
    select_patches,
)
from policy.runtime import VLAPolicy, VLARuntime
from policy.screen import decode_png, encode_png, screenshot_to_chw
from policy.tokens import ParseError, char_ids, short_thought, train_tokenizer
from schemas import Action

pytestmark = pytest.mark.browser  # the data are real MiniWoB++ screens

TINY = {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
TRAIN = VLATrainConfig(steps=40, batch_size=8, lr=3e-3, warmup_steps=5, keep_ratios=(0.25, 1.0), seed=0,
                       log_every=10, checkpoint_every=20, progress_bar=False)  # fmt: skip
RECIPE = VLARecipe(model=TINY, vocab_size=400, train=TRAIN)


def expert_rows(tasks: tuple[str, ...], episodes: int, seed: int) -> list[dict]:
    """One row per expert step, in the columns learner.data.tables.load_samples returns."""
    rows = []
    with GuiEnv(tasks[0]) as env:
        for task in tasks:
            expert = expert_for(task)
            for i in range(episodes):
                obs = env.reset(seed=seed + i, task=task)
                for step in range(6):
                    decision = expert.act(obs)
                    a = decision.action
                    rows.append(dict(episode_id=f"{task}-{seed + i}", step=step, task=task, instruction=obs.instruction,
                                     screenshot=encode_png(obs.screenshot), thought=decision.thought,
                                     action_type=a.type, x=a.x, y=a.y, text=a.text, key=a.key,
                                     target_box=list(decision.target_box or ())))  # fmt: skip
                    result = env.step(a)
                    if result.done:
                        break
                    obs = result.obs
    return rows


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    return pl.DataFrame(expert_rows(("click-test", "click-button", "enter-text"), 6, seed=100))


@pytest.fixture(scope="module")
def trained(frame, tmp_path_factory):
    out = tmp_path_factory.mktemp("vla")
    progress = []
    result = train_vla(frame, RECIPE, out, progress=progress.append)
    return result, progress, out


# --- tokens ----------------------------------------------------------------------------------------


def test_every_action_type_round_trips_through_tokens(frame):
    tok = train_tokenizer(frame["instruction"].to_list() + frame["thought"].to_list(), vocab_size=400)
    actions = [Action("click", x=81, y=104), Action("scroll", x=10, y=200, scroll_dy=50.0),
               Action("type", text="Kasie Mörk"), Action("key", key="<Enter>"), Action("noop")]  # fmt: skip
    for action in actions:
        parsed = tok.parse(tok.target_ids("The button 'ok' is at (81, 104). Click it.", action, 32))
        assert parsed.thought == "The button 'ok'. Click it."
        assert parsed.action.type == action.type and parsed.action.text == action.text
        assert parsed.action.key == action.key
        # Coordinates come back as the centre of their 5 px bin.
        assert abs(parsed.action.x - action.x) <= 2.5 and abs(parsed.action.y - action.y) <= 2.5


def test_the_prompt_carries_the_latest_actions_oldest_first(frame):
    from policy.tokens import HISTORY_TEXT_TOKENS

    tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=300)
    plain = tok.prompt_ids("Click OK.", 48)
    history = [Action("click", x=10, y=20), Action("type", text="a long text " * 20), Action("key", key="Enter")]
    assert tok.prompt_ids("Click OK.", 48, history, history_actions=0) == plain
    two = tok.prompt_ids("Click OK.", 48, history, history_actions=2)
    typed = tok.action_ids(history[1], HISTORY_TEXT_TOKENS)
    assert len(typed) == 2 + HISTORY_TEXT_TOKENS  # a long typed text is cut
    assert two == plain[:-1] + typed + tok.action_ids(history[2]) + plain[-1:]
    assert tok.prompt_ids("Click OK.", 48, history[:1], history_actions=2) == plain[:-1] + tok.action_ids(
        history[0]) + plain[-1:]  # fmt: skip
    assert len(two) - len(plain) <= tok.max_history_tokens(2)


def test_the_dataset_rebuilds_each_steps_history_from_its_episodes_earlier_steps(frame):
    tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=300)
    cfg = VLAConfig(vocab_size=tok.vocab_size, **TINY, history_actions=2)
    episode = frame.filter(pl.col("task") == "enter-text").sort("episode_id", "step")
    episode = episode.filter(pl.col("episode_id") == episode["episode_id"][0])
    assert episode.height >= 3
    data = VLADataset(episode.reverse(), tok, cfg, PruningConfig())  # sorted by the dataset itself
    actions = [Action(r["action_type"], x=r["x"], y=r["y"], text=r["text"], key=r["key"])
               for r in episode.iter_rows(named=True)]  # fmt: skip
    for step in range(episode.height):
        want = tok.prompt_ids(episode["instruction"][0], cfg.max_instruction_tokens, actions[:step], 2)
        assert data.prompt[step] == want
    # a row that carries the prompt it was sampled from keeps it
    given = episode.with_columns(pl.Series("prompt", [[1, 7, 2]] * episode.height, dtype=pl.List(pl.Int32)))
    assert VLADataset(given, tok, cfg, PruningConfig()).prompt[1] == [1, 7, 2]


def test_bad_token_sequences_are_refused_with_a_reason(frame):
    tok = train_tokenizer(frame["instruction"].to_list(), vocab_size=300)
    with pytest.raises(ParseError, match="no <act>"):
        tok.parse(tok.text_ids("just talking"))
    with pytest.raises(ParseError, match="x token then a y token"):
        tok.parse([tok.act_id, tok.type_ids["click"], tok.y0, tok.eos_id])


def test_grammar_mask_always_leads_to_a_parseable_action(frame):
    tok = train_tokenizer(frame["instruction"].to_list(), vocab_size=300)
    rng = np.random.default_rng(0)
    for _ in range(50):  # random walks under the mask
        ids: list[int] = []
        while not ids or ids[-1] != tok.eos_id:
            allowed = np.flatnonzero(tok.allowed_next(ids, 5, 4))
            assert len(allowed) > 0
            ids.append(int(rng.choice(allowed)))
        tok.parse(ids)  # does not raise


def test_short_thought_drops_coordinates_only():
    assert short_thought("There is a single button, at (80, 105). Click it.") == "There is a single button. Click it."
    assert short_thought("Click the username field at (3, 4) to type into it.") == (
        "Click the username field to type into it."
    )
    assert (
        short_thought("The username field is focused. Type 'kasie'.") == "The username field is focused. Type 'kasie'."
    )


# --- pruning ---------------------------------------------------------------------------------------


def test_prior_drops_flat_patches_keeps_anchors_and_penalises_unchanged():
    image = np.full((210, 160, 3), 255, np.uint8)
    image[100:120, 60:100] = np.random.default_rng(0).integers(0, 255, (20, 40, 3))  # a textured "button"
    cfg = PruningConfig(keep_ratio=0.25)
    prior = patch_prior(image, None, 10, cfg)
    anchors = anchor_mask(10, cfg.anchor_stride)
    textured = np.zeros((21, 16), bool)
    textured[10:12, 6:10] = True
    textured = textured.reshape(-1)
    assert (prior[anchors] > ANCHOR / 2).all()
    assert (prior[~anchors & ~textured] < -100).all()  # flat white
    assert (prior[~anchors & textured] == 0).all()
    kept = select_patches(np.zeros(336, np.float32), prior, keep_count(336, cfg.keep_ratio))
    assert len(kept) == 84 and (np.diff(kept) > 0).all()  # raster order
    assert set(np.flatnonzero(anchors)) | set(np.flatnonzero(textured)) <= set(kept)
    unchanged = patch_prior(image, image, 10, cfg)
    assert (unchanged[~anchors & textured] == -cfg.unchanged_penalty).all()


def test_keep_ratio_is_validated():
    with pytest.raises(ValueError, match="keep_ratio"):
        PruningConfig(keep_ratio=0.0)


# --- model and loss --------------------------------------------------------------------------------


def test_loss_ignores_unlabelled_positions_and_counts_the_target_patch():
    logits = torch.zeros(1, 3, 5)
    logits[0, 1, 2] = 10.0  # position 1 is confident about token 2
    labels = torch.tensor([[-100, 2, -100]])
    relevance = torch.zeros(1, 4)
    total, token_nll, relevance_nll = vla_loss(logits, labels, relevance, torch.tensor([1]), relevance_weight=0.5)
    assert token_nll.item() == pytest.approx(-torch.log_softmax(logits[0, 1], -1)[2].item())
    assert relevance_nll.item() == pytest.approx(np.log(4))  # uniform over 4 patches
    assert total.item() == pytest.approx(token_nll.item() + 0.5 * np.log(4))


def test_training_lowers_the_loss_and_checkpoints(trained):
    result, progress, out = trained
    assert [p.step for p in progress] == [10, 20, 30, 40]
    assert np.mean(result.losses[-5:]) < 0.6 * np.mean(result.losses[:5])
    assert (out / "vla_checkpoint.pt").exists()


def test_resumed_training_ends_with_the_same_weights(frame, tmp_path):
    whole = train_vla(frame, RECIPE, tmp_path / "whole")
    half = tmp_path / "half"
    first = train_vla(frame, RECIPE, half, stop_at=20)  # "killed" after step 20
    assert first.steps == 20
    resumed = train_vla(frame, RECIPE, half)  # picks up the step-20 checkpoint
    assert resumed.start_step == 20
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_lora_trains_adapters_only_and_merges_exactly(trained, frame, tmp_path):
    result, _, out = trained
    adapters = VLARecipe(train=VLATrainConfig(**{**TRAIN.__dict__, "steps": 10, "lora_rank": 4}))
    lora = train_vla(frame, adapters, tmp_path, init_checkpoint=out / "vla_checkpoint.pt")
    base = result.model.decoder.transformer.h[0].attn.c_attn.weight
    tuned = lora.model.decoder.transformer.h[0].attn.c_attn.weight  # merged
    assert not torch.allclose(base, tuned)  # the adapters moved the merged weight
    model, tok, _ = load_vla(tmp_path / "vla_checkpoint.pt")
    assert not hasattr(model.decoder, "peft_config")
    assert torch.equal(model.decoder.transformer.h[0].attn.c_attn.weight, tuned)
    wrapped = apply_lora(VLA(VLAConfig(vocab_size=tok.vocab_size, **TINY)), 4, 8.0)
    frozen = [n for n, p in wrapped.decoder.named_parameters() if not p.requires_grad]
    assert frozen and all("lora_" not in n for n in frozen)
    assert isinstance(merge_lora(wrapped).decoder, type(result.model.decoder))


# --- export and edge runtime -----------------------------------------------------------------------


def test_explicit_cache_decoder_equals_transformers(trained):
    assert check_decoder_parity(trained[0].model) < 1e-4


@pytest.fixture(scope="module")
def bundle(trained, tmp_path_factory):
    result = trained[0]
    path = export_bundle(
        result.model, result.tokenizer, PruningConfig(keep_ratio=0.25), tmp_path_factory.mktemp("b") / "m.vla"
    )
    return path, quantize_bundle(path, path.with_name("m-int8.vla"))


@pytest.mark.parametrize("keep_ratio", [0.25, 1.0])
def test_onnx_greedy_output_equals_torch_greedy_output(trained, frame, bundle, keep_ratio):
    result = trained[0]
    runtime = VLARuntime(bundle[0], keep_ratio=keep_ratio)
    pruning = PruningConfig(keep_ratio=keep_ratio)
    for row in frame.head(12).iter_rows(named=True):
        screen = decode_png(row["screenshot"])
        want, want_timing = torch_step(result.model, result.tokenizer, pruning, screen, row["instruction"], None)
        got, got_timing = runtime.step(screen, row["instruction"], None)
        assert got.ids == want.ids
        assert got.action_logprob == pytest.approx(want.action_logprob, abs=1e-3)
        assert got_timing.visual_tokens_kept == want_timing.visual_tokens_kept == keep_count(336, keep_ratio)


def test_a_model_with_history_acts_at_the_edge_as_torch_does_and_remembers_its_episode(trained, frame, tmp_path):
    from policy.interface import Observation

    tok = trained[0].tokenizer
    torch.manual_seed(0)
    model = VLA(VLAConfig(vocab_size=tok.vocab_size, **TINY, history_actions=3)).eval()
    pruning = PruningConfig(keep_ratio=1.0)
    path = export_bundle(model, tok, pruning, tmp_path / "history.vla")
    runtime = VLARuntime(path)
    row = frame.row(0, named=True)
    screen = decode_png(row["screenshot"])
    history = [Action("click", x=30, y=90), Action("type", text="hello"), Action("key", key="Enter")]
    want, _ = torch_step(model, tok, pruning, screen, row["instruction"], None, history)
    got, _ = runtime.step(screen, row["instruction"], None, history=history)
    assert got.ids == want.ids and got.action_logprob == pytest.approx(want.action_logprob, abs=1e-3)
    # The policy feeds its own earlier actions of the episode back, and forgets them at a new episode.
    policy = VLAPolicy(path, "h")
    first = policy.act(Observation("t", row["instruction"], screen, step=0))
    second = policy.act(Observation("t", row["instruction"], screen, step=1))
    alone, _ = runtime.step(screen, row["instruction"], screen, history=[first.action])
    assert list(second.tokens) == alone.ids
    again = policy.act(Observation("t", row["instruction"], screen, step=0))
    assert again.tokens == first.tokens


def test_int8_bundle_quantises_matmuls_and_still_acts(frame, bundle):
    import zipfile

    import onnx

    path, int8 = bundle
    with zipfile.ZipFile(int8) as zf:
        for graph in ("prefill.onnx", "decode.onnx"):
            ops = {node.op_type for node in onnx.load_from_string(zf.read(graph)).graph.node}
            assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops  # int8 weights, activations quantised per call
    assert int8.stat().st_size < path.stat().st_size
    policy = VLAPolicy(int8, "tiny-int8")
    from policy.interface import Observation

    row = frame.row(0, named=True)
    decision = policy.act(Observation("click-test", row["instruction"], decode_png(row["screenshot"])))
    assert decision.action.type in {"click", "type", "key", "scroll", "noop"}
    assert decision.extras["visual_tokens_kept"] == 84 and decision.extras["visual_tokens_total"] == 336
    assert decision.logprob is not None and decision.logprob <= 0.0


def test_a_bundle_from_another_format_is_refused(tmp_path):
    import zipfile

    bad = tmp_path / "bad.vla"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("vla.json", '{"format": "something-else/9"}')
    with pytest.raises(ValueError, match="bundle format 'something-else/9'"):
        VLARuntime(bad)


def test_a_model_with_word_context_exports_and_the_edge_encodes_as_torch_does(trained, frame, tmp_path):
    tok = trained[0].tokenizer
    model = VLA(VLAConfig(vocab_size=tok.vocab_size, **TINY, context_kernel=(3, 7))).eval()
    bundle = export_bundle(model, tok, PruningConfig(keep_ratio=0.25), tmp_path / "context.vla")
    runtime = VLARuntime(bundle)
    row = frame.row(0, named=True)
    feeds = runtime.encoder_feeds(decode_png(row["screenshot"]), row["instruction"])
    got_patches, got_relevance, _ = runtime.encoder.run(None, feeds)
    image, ids = torch.from_numpy(feeds["image"]), torch.from_numpy(feeds["instruction_ids"])
    with torch.inference_mode():
        want = model.encode(image, ids, ids)
    assert np.abs(got_patches - want.patches.numpy()).max() < 1e-3
    assert np.abs(got_relevance - want.relevance.numpy()).max() < 1e-3
    # the context conv is live: without it the same weights encode differently
    model.encoder.context = None
    with torch.inference_mode():
        plain = model.encode(image, ids, ids)
    assert np.abs(plain.patches.numpy() - want.patches.numpy()).max() > 1e-2


# --- the reading encoder and augmentation ------------------------------------------------------------

READING = {**TINY, "encoder": "reading", "reading_channels": 16, "reading_blocks": 2, "pointer_relevance": True}
AUGMENT = {"augment_shift_px": 6, "augment_scale": 0.05, "augment_colour": 0.1}


@pytest.fixture(scope="module")
def trained_reading(frame, tmp_path_factory):
    config = VLATrainConfig(**{**TRAIN.__dict__, **AUGMENT})
    return train_vla(frame, VLARecipe(model=READING, vocab_size=400, train=config), tmp_path_factory.mktemp("reading"))


def test_the_reading_encoder_learns_with_augmented_views(trained_reading):
    assert trained_reading.model.cfg.encoder == "reading"
    assert np.mean(trained_reading.losses[-5:]) < 0.6 * np.mean(trained_reading.losses[:5])


def test_the_reading_encoder_is_conditioned_on_the_instruction_characters(trained_reading, frame):
    model = trained_reading.model
    image = torch.from_numpy(screenshot_to_chw(decode_png(frame.row(0, named=True)["screenshot"]))[None])
    none = torch.zeros(1, 1, dtype=torch.long)
    with torch.inference_mode():
        a = model.encode(image, none, torch.tensor([char_ids('Click on the "ok" button.', 96)]))
        b = model.encode(image, none, torch.tensor([char_ids('Click on the "cancel" button.', 96)]))
    assert (a.relevance - b.relevance).abs().max() > 1e-3  # FiLM and cross-attention read the words
    blind = VLA(VLAConfig(vocab_size=model.cfg.vocab_size, **{**READING, "reading_condition": False})).eval()
    with torch.inference_mode():
        c = blind.encode(image, none, torch.tensor([char_ids('Click on the "ok" button.', 96)]))
        d = blind.encode(image, none, torch.tensor([char_ids('Click on the "cancel" button.', 96)]))
    assert torch.equal(c.relevance, d.relevance)  # the ablation's blind stem ignores them


@pytest.mark.parametrize("keep_ratio", [0.25, 1.0])
def test_a_reading_bundle_acts_as_torch_does(trained_reading, frame, tmp_path, keep_ratio):
    result = trained_reading
    path = export_bundle(result.model, result.tokenizer, PruningConfig(keep_ratio=0.25), tmp_path / "reading.vla")
    runtime = VLARuntime(path, keep_ratio=keep_ratio)
    assert [i.name for i in runtime.encoder.get_inputs()] == ["image", "instruction_chars"]
    for row in frame.head(8).iter_rows(named=True):
        screen = decode_png(row["screenshot"])
        want, _ = torch_step(result.model, result.tokenizer, PruningConfig(keep_ratio=keep_ratio), screen,
                             row["instruction"], None)  # fmt: skip
        got, _ = runtime.step(screen, row["instruction"], None)
        assert got.ids == want.ids
        assert got.action_logprob == pytest.approx(want.action_logprob, abs=1e-3)


def test_a_view_moves_the_click_target_with_the_pixels():
    image = np.full((210, 160, 3), 255, dtype=np.uint8)
    image[100:104, 60:64] = (200, 30, 30)  # a small red square centred on (62, 102)
    rng = np.random.default_rng(0)
    for _ in range(20):
        view = random_view(rng, 6, 0.05, 0.0, target=(62.0, 102.0))
        x, y = view.point(62.0, 102.0)
        seen = view.apply(image)
        assert seen[int(y), int(x), 0] > 150 and seen[int(y), int(x), 1] < 100, (view, x, y)
    # a target at the very edge is never pushed off the screen
    for _ in range(20):
        x, y = random_view(rng, 6, 0.05, 0.1, target=(159.0, 209.0)).point(159.0, 209.0)
        assert 0 <= x < 160 and 0 <= y < 210


def test_augmented_batches_label_the_pixels_the_expert_clicked(frame, monkeypatch):
    import learner.data.dataset as dataset
    from learner.data.augment import IDENTITY, View

    tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=400)
    cfg = VLAConfig(vocab_size=tok.vocab_size, **TINY)
    data = VLADataset(frame, tok, cfg, PruningConfig())
    clicks = np.array([i for i, a in enumerate(data.action) if a.type == "click"])
    shift = View(1.0, 5.0, -4.0, IDENTITY.gain, IDENTITY.offset)  # 5 px right, 4 px up
    monkeypatch.setattr(dataset, "random_view", lambda *args, **kwargs: shift)
    seen = data.batch(clicks, np.random.default_rng(1), VLATrainConfig(**AUGMENT).augmentation)
    for row, i in enumerate(clicks):
        a = data.action[i]
        x_id, y_id = (int(t) for t in seen["text_ids"][row][seen["labels"][row] != -100][-3:-1])  # <x> <y> <eos>
        assert (x_id - tok.x0, y_id - tok.y0) == (int((a.x + 5) // tok.bin_px), int((a.y - 4) // tok.bin_px))
        assert seen["target_patch"][row] == target_patch_index(a.x + 5, a.y - 4, cfg.patch_px)
        image = seen["image"][row].numpy().transpose(1, 2, 0)  # (210, 160, 3)
        assert np.array_equal(image[10:200, 10:150], data.screens[i][14:204, 5:145])  # the pixels moved alike
        assert (
            np.array_equal(seen["prior"][row].numpy(), patch_prior(image, None, cfg.patch_px, PruningConfig()))
            or data.previous[i] >= 0
        )  # a first step's prior is the shifted screen's


# --- learning happened -----------------------------------------------------------------------------


class RandomClicks:
    """The baseline: clicks uniformly at random over the task area."""

    version = "random"

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def act(self, obs):
        from policy.interface import Decision

        return Decision("", Action("click", x=float(self.rng.uniform(0, 160)), y=float(self.rng.uniform(0, 210))))


def test_a_tiny_vla_learns_click_test_from_pixels(tmp_path):
    from flywheel.gathering.evaluation import evaluate

    frame = pl.DataFrame(expert_rows(("click-test",), 40, seed=500))
    config = VLATrainConfig(steps=250, batch_size=16, lr=3e-3, warmup_steps=10, keep_ratios=(0.25,), seed=0,
                            checkpoint_every=0, progress_bar=False)  # fmt: skip
    result = train_vla(frame, VLARecipe(model=TINY, vocab_size=300, train=config), tmp_path)
    assert np.mean(result.losses[-10:]) < 0.3 * np.mean(result.losses[:10])
    path = export_bundle(result.model, result.tokenizer, PruningConfig(keep_ratio=0.25), tmp_path / "m.vla")
    # One action per episode: a policy that clicks until it hits would make chance look good.
    model, random = VLAPolicy(path, "tiny"), RandomClicks(0)
    learned = evaluate(lambda _: model, ("click-test",), 20, seed=900_000, max_steps=1)["mean_success_rate"]
    chance = evaluate(lambda _: random, ("click-test",), 20, seed=900_000, max_steps=1)["mean_success_rate"]
    assert learned >= 0.7 and learned >= chance + 0.4, (learned, chance)


# --- the click map -------------------------------------------------------------------------------------

MAP = {**TINY, "encoder": "reading", "reading_channels": 16, "reading_blocks": 2, "click_map": True}


@pytest.fixture(scope="module")
def trained_map(frame, tmp_path_factory):
    config = VLATrainConfig(
        **{**TRAIN.__dict__, **AUGMENT, "steps": 80, "balance": "episodes", "map_only_fraction": 0.125}
    )
    return train_vla(frame, VLARecipe(model=MAP, vocab_size=400, train=config), tmp_path_factory.mktemp("map"))


def test_click_positives_cover_the_targets_element_and_always_its_clicked_bin():
    positives = click_positives((52.0, 33.0), (40.0, 20.0, 70.0, 40.0), bin_px=5)
    assert positives.shape == (42, 32)
    ys, xs = np.nonzero(positives)
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (8, 13, 4, 7)  # bin centres 42.5..67.5, 22.5..37.5
    tiny = click_positives((52.0, 33.0), (51.0, 32.0, 52.0, 33.0), bin_px=5)  # no bin centre inside
    assert np.argwhere(tiny).tolist() == [[6, 10]]
    assert not click_positives(None, (40.0, 20.0, 70.0, 40.0), bin_px=5).any()  # a key press has no target


def test_a_task_balanced_sampler_draws_every_task_alike(frame):
    tok = train_tokenizer(tokenizer_corpus(frame), vocab_size=400)
    data = VLADataset(frame, tok, VLAConfig(vocab_size=tok.vocab_size, **MAP), PruningConfig())
    rng = np.random.default_rng(0)
    tasks = data.tasks[data.sample(rng, 3000, balance="tasks")]
    shares = {t: float(np.mean(tasks == t)) for t in ("click-test", "click-button", "enter-text")}
    assert all(abs(share - 1 / 3) < 0.04 for share in shares.values()), shares
    uniform = data.tasks[data.sample(rng, 3000)]
    assert np.mean(uniform == "enter-text") > 0.45  # its episodes are 3-4 steps long: uniform rows favour it
    # "episodes": a task's share is its mean episode length over the sum of them (1, 1 and 3-4 steps here).
    lengths = {t: np.mean(data.tasks[data.trainable] == t) / frame.filter(pl.col("task") == t)["episode_id"].n_unique()
               for t in shares}  # fmt: skip
    tasks = data.tasks[data.sample(rng, 6000, balance="episodes")]
    for task, length in lengths.items():
        assert abs(np.mean(tasks == task) - length / sum(lengths.values())) < 0.03, (task, np.mean(tasks == task))
    with pytest.raises(ValueError, match="balance must be one of"):
        data.sample(rng, 4, balance="tasks_alike")
    clicks = data.sample(rng, 500, clicks_only=True)
    assert all(data.action[i].type == "click" for i in clicks)
    counts = data.rows_per_task()
    assert counts["click-test"]["click_rows"] == counts["click-test"]["rows"] == 6
    assert 0 < counts["enter-text"]["click_rows"] < counts["enter-text"]["rows"]  # it types too


def test_the_map_is_one_softmax_over_the_screen_and_scores_the_coordinate_tokens(trained_map, frame):
    model = trained_map.model
    batch = VLADataset(frame, trained_map.tokenizer, model.cfg, PruningConfig()).batch(np.arange(4))
    with torch.inference_mode():
        logits, relevance, click_map = model(batch["image"], batch["prior"], batch["instruction_ids"],
                                             batch["instruction_chars"], batch["text_ids"], 84)  # fmt: skip
    assert click_map.shape == (4, 42, 32)
    assert torch.allclose(click_map.exp().sum((1, 2)), torch.ones(4), atol=1e-4)
    # the cell relevance is the map's cell marginal, up to a constant per screen
    cells = click_map.reshape(4, 21, 2, 16, 2).logsumexp((2, 4)).reshape(4, -1)
    assert torch.allclose((relevance - cells).std(1), torch.zeros(4), atol=1e-4)
    # the x token of a click reads the column marginal; the y token the column the x token chose
    row = 0
    labels = batch["labels"][row]
    x_pos = int(torch.nonzero((labels >= model.x0) & (labels < model.x0 + model.nx))[0, 0])
    x = int(labels[x_pos]) - model.x0
    got_x = logits[row, x_pos, model.x0 : model.x0 + model.nx]
    assert torch.allclose(got_x, click_map[row].logsumexp(0), atol=1e-5)
    got_y = logits[row, x_pos + 1, model.y0 : model.y0 + model.ny]
    assert torch.allclose(got_y, click_map[row, :, x] - click_map[row, :, x].logsumexp(0), atol=1e-5)


def test_the_map_learns_and_its_pretraining_leaves_the_decoder_alone(trained_map, frame, tmp_path):
    # 1 step in 8 is map-only (the click NLL alone), spread through the run; the rest are token + click
    map_only = [is_map_only_step(step, 0.125) for step in range(len(trained_map.losses))]
    assert sum(map_only) == 10 and map_only[7] and not map_only[0]
    pretraining = [loss for loss, alone in zip(trained_map.losses, map_only, strict=True) if alone]
    full = [loss for loss, alone in zip(trained_map.losses, map_only, strict=True) if not alone]
    assert pretraining[-1] < 0.6 * np.log(42 * 32)  # from a uniform map
    assert np.mean(full[-5:]) < 0.6 * np.mean(full[:5])
    config = VLATrainConfig(**{**TRAIN.__dict__, "steps": 6, "map_only_fraction": 1.0, "checkpoint_every": 0})
    result = train_vla(frame, VLARecipe(model=MAP, vocab_size=400, train=config), tmp_path / "pretrained")
    # the same seed builds the same fresh model: trained for 0 steps, it is where the pretraining started
    start = train_vla(frame, VLARecipe(model=MAP, vocab_size=400, train=replace(config, steps=0)), tmp_path / "start")
    changed = {name for name, p in result.model.named_parameters()
               if not torch.equal(p, dict(start.model.named_parameters())[name])}  # fmt: skip
    assert any(name.startswith("encoder.") for name in changed)
    assert not any(name.startswith("decoder.") for name in changed)


def test_loss_weights_draw_the_map_towards_the_tasks_it_still_gets_wrong():
    weights = TaskLossWeights(3)
    assert np.allclose(weights.probabilities(), 1 / 3)
    for _ in range(50):  # task 0 solved, task 2 still wrong; a row without a target (NaN) counts for nothing
        weights.update(np.array([0, 0, 1, 2, 2, 1]), np.array([0.01, 0.01, 1.0, 4.0, 4.0, np.nan]))
    p = weights.probabilities()
    assert p[2] > p[1] > p[0] >= 0.5 / 3 and np.isclose(p.sum(), 1.0)  # the uniform half: no task starves
    with pytest.raises(ValueError, match="click tasks"):
        TaskLossWeights(2, nll=[1.0, 2.0, 3.0])  # a checkpoint's weights for other data


def test_a_loss_balanced_map_run_resumes_with_the_same_weights_and_draws(frame, tmp_path):
    config = VLATrainConfig(**{**TRAIN.__dict__, "steps": 12, "map_only_fraction": 1.0, "map_balance": "loss",
                               "checkpoint_every": 6})  # fmt: skip
    recipe = VLARecipe(model=MAP, vocab_size=400, train=config)
    whole = train_vla(frame, recipe, tmp_path / "whole")
    train_vla(frame, recipe, tmp_path / "half", stop_at=6)
    resumed = train_vla(frame, recipe, tmp_path / "half")
    assert resumed.start_step == 6
    sampler = [torch.load(tmp_path / run / "vla_checkpoint.pt", weights_only=True)["sampler"]
               for run in ("whole", "half")]  # fmt: skip
    assert sampler[0] == sampler[1] and len(sampler[0]["map_task_nll"]) == 3  # enter-text clicks its field too
    assert sampler[0]["map_task_nll"] != [1.0, 1.0, 1.0]  # the weights moved off their start
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    unknown = VLARecipe(model=MAP, vocab_size=400, train=replace(config, map_balance="hard"))
    with pytest.raises(ValueError, match="map_balance"):
        train_vla(frame, unknown, tmp_path / "unknown")


def test_pruning_never_drops_the_maps_top_cells():
    relevance = np.zeros(336, np.float32)
    relevance[[100, 101, 200, 300]] = [9.0, 8.0, 7.0, 6.0]
    prior = np.zeros(336, np.float32)
    prior[[100, 101, 200, 300]] = -FLAT  # solid colour boxes: flat, yet they are what the map points at
    prior[:84] += ANCHOR
    assert not set(select_patches(relevance, prior, 84)) & {100, 101, 200, 300}
    assert {100, 101, 200, 300} <= set(select_patches(relevance, prior, 84, MAP_TOP_CELLS))


def test_a_map_bundle_acts_as_torch_does(trained_map, frame, tmp_path):
    result = trained_map
    assert check_decoder_parity(result.model) < 1e-4
    path = export_bundle(result.model, result.tokenizer, PruningConfig(keep_ratio=0.25), tmp_path / "map.vla")
    runtime = VLARuntime(path)
    assert [o.name for o in runtime.encoder.get_outputs()] == ["patches", "relevance", "click_map"]
    clicks = 0
    for keep_ratio in (0.25, 1.0):
        runtime = VLARuntime(path, keep_ratio=keep_ratio)
        for row in frame.head(8).iter_rows(named=True):
            screen = decode_png(row["screenshot"])
            want, _ = torch_step(result.model, result.tokenizer, PruningConfig(keep_ratio=keep_ratio), screen,
                                 row["instruction"], None)  # fmt: skip
            got, _ = runtime.step(screen, row["instruction"], None)
            assert got.ids == want.ids
            assert got.action_logprob == pytest.approx(want.action_logprob, abs=1e-3)
            clicks += result.tokenizer.parse(got.ids).action.type == "click"
    assert clicks > 0


def test_diagnose_measures_the_map_and_the_pruning_recall_as_the_edge_runs_them(trained_map, frame, tmp_path):
    from flywheel.run.diagnose import box_cells, diagnose_screens

    result = trained_map
    path = export_bundle(result.model, result.tokenizer, PruningConfig(keep_ratio=0.25), tmp_path / "map.vla")
    rows = [r for r in frame.iter_rows(named=True) if r["action_type"] == "click" and r["target_box"]][:10]
    screens = [{"screenshot": decode_png(r["screenshot"]), "instruction": r["instruction"], "point": (r["x"], r["y"]),
                "box": tuple(r["target_box"])} for r in rows]  # fmt: skip
    found = diagnose_screens(VLARuntime(path), screens)
    want, protected = [], []
    for screen in screens:
        with torch.inference_mode():
            image = torch.from_numpy(screenshot_to_chw(screen["screenshot"])[None])
            chars = torch.tensor([char_ids(screen["instruction"], 96)])
            encoded = result.model.encode(image, torch.zeros(1, 1, dtype=torch.long), chars)
        row, col = divmod(int(encoded.click_map[0].argmax()), encoded.click_map.shape[2])
        left, top, right, bottom = screen["box"]
        want.append(left <= (col + 0.5) * 5 <= right and top <= (row + 0.5) * 5 <= bottom)
        top_cells = set(encoded.relevance[0].topk(MAP_TOP_CELLS).indices.tolist())
        protected.append(bool(top_cells & box_cells(screen["box"], 10, 21, 16)))
    assert found["screens"] == 10 and found["map_in_box"] == pytest.approx(np.mean(want))
    assert found["target_recall"] >= np.mean(protected)  # a target under one of the map's top cells is always kept
    assert 0.0 <= found["click_in_box"] <= 1.0
