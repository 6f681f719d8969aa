"""The VLA at the edge: onnxruntime encoder + explicit-KV-cache decoder, greedy or sampled decoding, no torch.

One step:
    encoder(image, instruction)        -> patches (N, d), relevance (N,)   (instruction as BPE ids or characters)
                                          [, click map (2R, 2C): a click-map model's coordinates, before pruning]
    select_patches(relevance + prior)  -> kept (k,)                       (policy.pruning)
    prefill([patches[kept] | wte[<bos> instruction history <sep>]])  -> logits, KV cache (into the cache buffers)
    repeat: token = argmax or a draw (policy.sampling) of the logits masked by the action grammar;
            decode(wte[token], cache) until <eos>
            (decode appends the token's keys/values to the cache buffers in place)
    parse tokens -> thought + action
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from policy.bundle import WEIGHTS, BundleError, read_bundle
from policy.expectations import EXPECT_CHANGE, expect_change_near, expect_text
from policy.interface import Decision, Observation, Policy
from policy.pruning import MAP_TOP_CELLS, PruningConfig, keep_count, patch_prior, select_patches
from policy.sampling import GREEDY, MAX_NEW_TOKENS, Generation, Sampling, generate
from policy.screen import POSITIONAL_TYPES, screenshot_to_chw
from policy.tokens import ActionTokenizer, Parsed, char_ids
from schemas import Action


@dataclass(frozen=True)
class StepTiming:
    encode_ms: float
    prefill_ms: float
    decode_ms: float
    decode_tokens: int
    visual_tokens_total: int
    visual_tokens_kept: int


class VLARuntime:
    """Loads a `.vla` bundle (policy.bundle) into three onnxruntime sessions.

    One step at a time: the KV cache and the decode graph's binding belong to the runtime, not the step.
    """

    def __init__(self, path: str | Path, intra_op_threads: int = 1, keep_ratio: float | None = None):
        """BundleError, naming the file and the failure, for anything that does not load and take one step:
        a bundle comes over the network, and a client must keep its old model rather than crash on a new one."""
        meta, members = read_bundle(path)
        try:
            self._build(meta, members, intra_op_threads, keep_ratio)
            # A graph that loads may still not run, or run on weights that are not numbers.
            generation, _ = self.step(np.zeros((210, 160, 3), np.uint8), "click", None)
        except Exception as error:  # onnxruntime's errors derive from Exception only; any failure here refuses it
            raise BundleError(f"{path}: does not run: {type(error).__name__}: {error}") from error
        if not np.isfinite(generation.token_logprobs).all():
            raise BundleError(f"{path}: its first step's log-probabilities are not finite (damaged weights?)")

    def _build(self, meta: dict, members: dict[str, bytes], intra_op_threads: int, keep_ratio: float | None) -> None:
        self.config: dict = meta["model_config"]
        self.quantized = bool(meta.get("quantized"))
        pruning = PruningConfig(**meta["pruning"])
        if keep_ratio is not None:
            pruning = PruningConfig(**{**meta["pruning"], "keep_ratio": keep_ratio})
        self.pruning = pruning
        self.tok = ActionTokenizer.from_json(members["tokenizer.json"].decode())
        self.wte = np.load(io.BytesIO(members["wte.npy"]))  # (V, d)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # a shared 2-core box
        # Held for the sessions' lifetime: onnxruntime may use the tensors in this buffer where they lie.
        self._weights = np.frombuffer(members[WEIGHTS], dtype=np.uint8)
        opts.add_external_initializers_from_files_in_memory([WEIGHTS], [self._weights], [len(self._weights)])
        providers = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(members["encoder.onnx"], sess_options=opts, providers=providers)
        self.prefill = ort.InferenceSession(members["prefill.onnx"], sess_options=opts, providers=providers)
        self.decode = ort.InferenceSession(members["decode.onnx"], sess_options=opts, providers=providers)
        self.click_map = bool(self.config.get("click_map"))
        self.patch_px = int(self.config["patch_px"])
        self.rows, self.cols = 210 // self.patch_px, 160 // self.patch_px
        self.num_patches = self.rows * self.cols
        heads, d, layers = int(self.config["n_heads"]), int(self.config["d_model"]), int(self.config["n_layers"])
        # The KV cache: one buffer per layer and K/V, bound as both the decode graph's cache input and its
        # present output, which its attention appends to in place. Room for every patch and the longest
        # prompt and answer; a step only reads the slots it filled.
        self.history_actions = int(self.config.get("history_actions", 0))
        prompt_room = (
            int(self.config["max_instruction_tokens"]) + 2 + ActionTokenizer.max_history_tokens(self.history_actions)
        )
        capacity = self.num_patches + prompt_room + MAX_NEW_TOKENS
        self.cache = [np.zeros((1, heads, capacity, d // heads), np.float32) for _ in range(2 * layers)]
        self.logits = np.zeros((1, self.tok.vocab_size), np.float32)
        self.binding = self.decode.io_binding()
        for name, buffer in zip(cache_names(layers), self.cache, strict=True):
            self.binding.bind_ortvalue_input(f"cache_{name}", ort.OrtValue.ortvalue_from_numpy(buffer))
            self.binding.bind_ortvalue_output(f"present_{name}", ort.OrtValue.ortvalue_from_numpy(buffer))
        self.binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self.logits))

    def prompt(self, instruction: str, history: Sequence[Action] = ()) -> list[int]:
        return self.tok.prompt_ids(instruction, int(self.config["max_instruction_tokens"]), history,
                                   self.history_actions)  # fmt: skip

    def encoder_feeds(self, screenshot: np.ndarray, instruction: str) -> dict[str, np.ndarray]:
        """The encoder graph's inputs: the screen, and the instruction as BPE ids or as characters."""
        feeds = {"image": screenshot_to_chw(screenshot)[None]}
        if self.config.get("encoder", "patch") == "reading":
            feeds["instruction_chars"] = np.array([char_ids(instruction, int(self.config["max_instruction_chars"]))])
        else:
            ids = self.tok.instruction_ids(instruction, int(self.config["max_instruction_tokens"]))
            feeds["instruction_ids"] = np.array([ids or [0]], dtype=np.int64)
        return feeds

    def step(
        self, screenshot: np.ndarray, instruction: str, previous: np.ndarray | None,
        sampling: Sampling = GREEDY, rng: np.random.Generator | None = None, history: Sequence[Action] = (),
    ) -> tuple[Generation, StepTiming]:  # fmt: skip
        """One think step on a (210, 160, 3) screenshot; `previous` is the episode's previous frame or None,
        `history` its actions so far (read when the model was trained with history_actions > 0)."""
        t0 = time.perf_counter()
        prompt = self.prompt(instruction, history)
        patches, relevance, third = self.encoder.run(None, self.encoder_feeds(screenshot, instruction))
        prior = patch_prior(screenshot, previous, self.patch_px, self.pruning)
        keep = keep_count(self.num_patches, self.pruning.keep_ratio)
        kept = select_patches(relevance[0], prior, keep, MAP_TOP_CELLS if self.click_map else 0)
        t1 = time.perf_counter()
        pointing = {}
        if not self.click_map:  # third: every patch's pointer key
            in_col, in_row = membership(kept, self.cols, self.rows)
            pointing = {"pointer_keys": third[0, kept], "in_col": in_col, "in_row": in_row}
        if self.config.get("pointer_relevance"):  # the decoder points from where the encoder found the target
            pointing["kept_relevance"] = np.ascontiguousarray(relevance[0, kept], dtype=np.float32)
        embeds = np.concatenate([patches[0, kept], self.wte[prompt]]).astype(np.float32)
        logits, *presents = self.prefill.run(None, {"inputs_embeds": embeds, **pointing})
        if self.click_map:  # third: the click map, scoring the coordinate tokens
            logits = map_scored(logits[0], third[0], prompt[-1], self.tok)[None]
        length = len(embeds)
        for buffer, present in zip(self.cache, presents, strict=True):
            buffer[:, :, :length] = present
        for name, value in pointing.items():
            self.binding.bind_cpu_input(name, value)
        t2 = time.perf_counter()

        def advance(token: int) -> np.ndarray:
            nonlocal length
            length += 1
            inputs = {  # held until the run is done: the binding may point into their memory
                "inputs_embeds": self.wte[[token]],
                "positions": np.array([length - 1], dtype=np.int64),
                "seqlens_k": np.array([length - 1], dtype=np.int32),  # GroupQueryAttention's total - 1
                "total_len": np.array(length, dtype=np.int32),
            }
            for name, value in inputs.items():
                self.binding.bind_cpu_input(name, value)
            self.decode.run_with_iobinding(self.binding)
            if self.click_map:
                return map_scored(self.logits[0], third[0], token, self.tok)
            return self.logits[0]  # overwritten by the next call: generate reads it before that

        gen = generate(logits[0], advance, self.tok, int(self.config["max_thought_tokens"]), sampling, rng)
        t3 = time.perf_counter()
        timing = StepTiming((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, gen.steps, self.num_patches, len(kept))
        return gen, timing


def cache_names(n_layers: int) -> list[str]:
    """['key_0', 'value_0', 'key_1', ...]: the decoder graphs' cache_* inputs and present_* outputs."""
    return [f"{kv}_{layer}" for layer in range(n_layers) for kv in ("key", "value")]


def map_scored(logits: np.ndarray, click_map: np.ndarray, read_token: int, tok: ActionTokenizer) -> np.ndarray:
    """(V,) decoder logits with the coordinate tokens scored by the click map (Y, X) of log-probabilities, as
    learner.model.vla.VLA.map_scores: x by the map's column marginal, y by the column of the x token just read (the row
    marginal elsewhere; the grammar allows y only there)."""
    out = logits.astype(np.float32, copy=True)
    x_marginal = logsumexp(click_map, axis=0)  # (X,) log P(x)
    out[tok.x0 : tok.x0 + tok.nx] = x_marginal
    column = read_token - tok.x0
    if 0 <= column < tok.nx:
        out[tok.y0 : tok.y0 + tok.ny] = click_map[:, column] - x_marginal[column]  # log P(y | x)
    else:
        out[tok.y0 : tok.y0 + tok.ny] = logsumexp(click_map, axis=1)
    return out


def logsumexp(values: np.ndarray, axis: int) -> np.ndarray:
    top = values.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(values - top).sum(axis=axis, keepdims=True))).squeeze(axis)


def membership(kept: np.ndarray, cols: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, C) and (k, R) float32: 1 where kept patch i (raster index) lies in column c / row r."""
    in_col = (kept[:, None] % cols == np.arange(cols)).astype(np.float32)
    in_row = (kept[:, None] // cols == np.arange(rows)).astype(np.float32)
    return in_col, in_row


def decision_from(parsed: Parsed, gen: Generation, timing: StepTiming, sampling: Sampling = GREEDY) -> Decision:
    """The runtime's output as a Decision, with what verify should see afterwards."""
    action = parsed.action
    if action.type in POSITIONAL_TYPES:
        expected = expect_change_near(action.x, action.y)
    elif action.type == "type":
        expected = expect_text(action.text)
    else:
        expected = "" if action.type == "noop" else EXPECT_CHANGE
    extras = {
        "visual_tokens_total": timing.visual_tokens_total,
        "visual_tokens_kept": timing.visual_tokens_kept,
        "encode_ms": timing.encode_ms,
        "prefill_ms": timing.prefill_ms,
        "decode_ms": timing.decode_ms,
        "decode_tokens": timing.decode_tokens,
    }
    return Decision(
        thought=parsed.thought, action=action, expected=expected, logprob=gen.action_logprob, extras=extras,
        tokens=tuple(gen.ids), token_logprobs=tuple(gen.token_logprobs), sampling=sampling,
    )  # fmt: skip


class VLAPolicy:
    """Policy protocol over a VLA bundle. Remembers the episode's previous frame (for pruning) and its actions
    so far (the prompt's history).

    `sampling` greedy (the default) for eval; a temperature > 0 explores (policy.sampling)."""

    def __init__(self, path: str | Path, version: str, intra_op_threads: int = 1, keep_ratio: float | None = None,
                 sampling: Sampling = GREEDY):  # fmt: skip
        self.version = version
        self.runtime = VLARuntime(path, intra_op_threads, keep_ratio)
        self.sampling = sampling
        self._rng = np.random.default_rng(sampling.seed)
        self._previous: np.ndarray | None = None
        self._history: list[Action] = []

    def act(self, obs: Observation) -> Decision:
        previous = self._previous if obs.step > 0 else None
        gen, timing = self.runtime.step(obs.screenshot, obs.instruction, previous, self.sampling, self._rng,
                                        self._history if obs.step > 0 else ())  # fmt: skip
        decision = decision_from(self.runtime.tok.parse(gen.ids), gen, timing, self.sampling)
        self.remember(obs, decision.action)
        return decision

    def remember(self, obs: Observation, action: Action) -> None:
        """`action` was taken on `obs`, chosen by this policy or not (a replayed or searched step): the next
        step's history holds it and its previous frame is `obs`."""
        if obs.step == 0:
            self._history = []
        self._previous = obs.screenshot
        self._history.append(action)


def load_policy(path, version: str, intra_op_threads: int = 1, keep_ratio: float | None = None,
                sampling: Sampling = GREEDY) -> Policy:  # fmt: skip
    """A `.vla` bundle as a Policy; `keep_ratio` overrides the bundle's visual-token keep ratio; `sampling`
    greedy (eval) or exploring."""
    return VLAPolicy(path, version, intra_op_threads=intra_op_threads, keep_ratio=keep_ratio, sampling=sampling)
