"""Export the VLA for the edge: two ONNX graphs with an explicit KV cache, packed in one bundle file.

    encoder.onnx   image (1, 3, 210, 160) uint8, instruction_ids (1, L) int64
                   -> patches (1, N, d), relevance (1, N), pointer_keys (1, N, r)
    decoder.onnx   inputs_embeds (1, T, d), pointer_keys (1, k, r), col_bias (1, k, C), row_bias (1, k, R)
                   (learner.vla.Pointer of the kept patches), past_key_0, past_value_0, ... (1, H, P, d/H) per layer
                   -> logits (1, V) of the last position, present_key_0, present_value_0, ... (1, H, P + T, d/H)

The cache is one tensor per layer and K/V (a stacked cache costs an extra copy of it per token) and the
pointer inputs are computed once per step: together 2.8x faster decode steps than a stacked cache
with per-token pointer keys (0.50 vs 1.40 ms at 400 cached positions, measured). Reshapes by constants
and plain matmuls instead of transformers' Conv1D took the optimised graph from 349 to 160 nodes, and the
last layer runs for the last position only: decode 0.60 -> 0.40 ms per token at 400 cached positions,
a 350-token prefill 14.8 -> 11.9 ms (one thread, same outputs to 4e-6).

The decoder re-implements GPT-2's forward over the trained transformers modules with the cache as
plain tensors (HF cache classes export poorly); `check_decoder_parity` proves it equals the transformers
forward. Token embeddings for decode steps are looked up by the runtime from `wte.npy`.

The bundle (`.vla`, a zip) holds both graphs, wte.npy, tokenizer.json and vla.json (model + pruning
config); its sha256 is what a ModelVersionEvent names. `quantize_bundle` writes the int8 variant.
"""

from __future__ import annotations

import copy
import io
import json
import math
import warnings
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from edge_client.preprocess import SCREEN_H, SCREEN_W
from edge_client.pruning import PruningConfig
from edge_client.vla_runtime import BUNDLE_FORMAT
from edge_client.vla_tokens import ActionTokenizer
from learner.vla import VLA, Pointer

OPSET = 17


class EncoderGraph(nn.Module):
    def __init__(self, model: VLA):
        super().__init__()
        self.encoder = model.encoder
        self.pointer_k = model.pointer_k

    def forward(self, image: torch.Tensor, instruction_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        encoded = self.encoder(image, instruction_ids)
        # Pointer keys of every patch (a per-token linear map): the runtime keeps the rows of the kept patches.
        return encoded.patches, encoded.relevance, self.pointer_k(encoded.patches)


class DecoderWithCache(nn.Module):
    """GPT-2 forward with the KV cache as explicit tensors; returns only the last position's logits."""

    def __init__(self, model: VLA):
        super().__init__()
        gpt = model.decoder
        self.model = model
        self.blocks = gpt.transformer.h
        self.wpe = gpt.transformer.wpe
        self.ln_f = gpt.transformer.ln_f
        self.n_heads = model.cfg.n_heads
        self.head_dim = model.cfg.d_model // model.cfg.n_heads

    def forward(
        self,
        inputs_embeds: torch.Tensor,  # (1, T, d): the edge runs one sequence at a time
        pointer_keys: torch.Tensor,  # (1, k, r)
        col_bias: torch.Tensor,  # (1, k, C)
        row_bias: torch.Tensor,  # (1, k, R)
        *past: torch.Tensor,  # key_0, value_0, key_1, ...: (1, H, P, hd) each
    ) -> tuple[torch.Tensor, ...]:
        # Reshapes use constants and -1, never sizes read from tensors: each size read becomes a chain of
        # Shape/Gather/Unsqueeze/Concat nodes, and at one token per call the graph's node count, not its
        # arithmetic, sets the decode time.
        t, p = inputs_embeds.shape[1], past[0].shape[2]
        heads, hd, d = self.n_heads, self.head_dim, self.n_heads * self.head_dim
        positions = torch.arange(t, dtype=torch.long) + p  # (T,) absolute positions
        h = inputs_embeds + self.wpe(positions)
        # Query i (absolute p + i) sees keys 0 .. p + i.
        visible = torch.arange(p + t)[None, :] <= positions[:, None]  # (T, P + T)
        presents = []
        for layer, block in enumerate(self.blocks):
            q, k, v = linear(block.attn.c_attn, block.ln_1(h)).split(d, dim=2)  # 3 x (1, T, d)
            q, k, v = (x.reshape(1, -1, heads, hd).transpose(1, 2) for x in (q, k, v))  # (1, H, T, hd)
            k = torch.cat([past[2 * layer], k], dim=2)  # (1, H, P + T, hd)
            v = torch.cat([past[2 * layer + 1], v], dim=2)
            presents += [k, v]
            if layer == len(self.blocks) - 1:
                # Only the last position's output is read, and the last layer's keys and values are already
                # in the cache: its attention and MLP run for that one position (a sixth of a prefill).
                q, h, visible = q[:, :, -1:], h[:, -1:], visible[-1:]
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)  # (1, H, T, P + T)
            scores = scores.masked_fill(~visible, float("-inf"))
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, -1, d)
            h = h + linear(block.attn.c_proj, y)
            h = h + linear(block.mlp.c_proj, block.mlp.act(linear(block.mlp.c_fc, block.ln_2(h))))
        logits = self.model.output_logits(self.ln_f(h), Pointer(pointer_keys, col_bias, row_bias))[:, 0]
        return (logits, *presents)  # (1, V), then the per-layer cache


def linear(conv1d: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' Conv1D as x @ W + b: its forward flattens to 2-D and back, two reshapes per layer."""
    return x @ conv1d.weight + conv1d.bias


def cache_names(n_layers: int, kind: str) -> list[str]:
    """['past_key_0', 'past_value_0', 'past_key_1', ...] (kind 'past') or the 'present_' outputs."""
    return [f"{kind}_{kv}_{layer}" for layer in range(n_layers) for kv in ("key", "value")]


def empty_cache(model: VLA) -> list[torch.Tensor]:
    cfg = model.cfg
    return [torch.zeros(1, cfg.n_heads, 0, cfg.d_model // cfg.n_heads) for _ in range(2 * cfg.n_layers)]


def check_decoder_parity(model: VLA, seed: int = 0, atol: float = 1e-4) -> float:
    """Max |DecoderWithCache (prefill + 3 cached steps) - transformers forward| over the last-position logits."""
    gen = torch.Generator().manual_seed(seed)
    dec = DecoderWithCache(model).eval()
    embeds = torch.randn(1, 12, model.cfg.d_model, generator=gen)
    worst = 0.0
    with torch.inference_mode():
        pointer = model.pointer_targets(embeds[:, :5], torch.tensor([[3, 40, 41, 200, 300]]))
        logits, *cache = dec(embeds[:, :9], *pointer, *empty_cache(model))
        for t in range(9, 12):
            hidden = model.decoder.transformer(inputs_embeds=embeds[:, :t]).last_hidden_state[:, -1:]
            want = model.output_logits(hidden, pointer)[:, 0]
            worst = max(worst, float((logits - want).abs().max()))
            logits, *cache = dec(embeds[:, t : t + 1], *pointer, *cache)
    if worst > atol:
        raise AssertionError(f"explicit-cache decoder differs from transformers by {worst:.2e} > {atol:.0e}")
    return worst


def _export(module: nn.Module, args: tuple, names_in: list[str], names_out: list[str], dynamic: dict) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notices
        torch.onnx.export(
            module, args, buffer, input_names=names_in, output_names=names_out, dynamic_axes=dynamic,
            opset_version=OPSET, do_constant_folding=True, dynamo=False,
        )  # fmt: skip
    proto = onnx.load_from_string(buffer.getvalue())
    proto.producer_name = "flywheel.learner"
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def export_bundle(model: VLA, tok: ActionTokenizer, pruning: PruningConfig, path: str | Path) -> Path:
    """Write the `.vla` bundle for `model` (CPU, eval; LoRA merged) after checking the explicit-cache decoder."""
    net = copy.deepcopy(model).cpu().eval()
    check_decoder_parity(net)
    cfg = net.cfg
    image = torch.randint(0, 256, (1, 3, SCREEN_H, SCREEN_W), dtype=torch.uint8)
    ids = torch.randint(10, cfg.vocab_size, (1, 7))
    encoder = _export(
        EncoderGraph(net), (image, ids), ["image", "instruction_ids"], ["patches", "relevance", "pointer_keys"],
        {"image": {0: "batch"}, "instruction_ids": {0: "batch", 1: "length"}, "patches": {0: "batch"},
         "relevance": {0: "batch"}, "pointer_keys": {0: "batch"}},
    )  # fmt: skip
    past = [torch.zeros(1, cfg.n_heads, 3, cfg.d_model // cfg.n_heads) for _ in range(2 * cfg.n_layers)]
    pointer = net.pointer_targets(torch.randn(1, 4, cfg.d_model), torch.tensor([[0, 5, 9, 30]]))
    past_names, present_names = cache_names(cfg.n_layers, "past"), cache_names(cfg.n_layers, "present")
    decoder = _export(
        DecoderWithCache(net), (torch.randn(1, 5, cfg.d_model), *pointer, *past),
        ["inputs_embeds", "pointer_keys", "col_bias", "row_bias", *past_names], ["logits", *present_names],
        {"inputs_embeds": {1: "tokens"}, "pointer_keys": {1: "kept"}, "col_bias": {1: "kept"}, "row_bias": {1: "kept"},
         **{name: {2: "past"} for name in past_names}, **{name: {2: "total"} for name in present_names}},
    )  # fmt: skip
    wte = io.BytesIO()
    np.save(wte, net.wte.weight.detach().numpy().astype(np.float32))
    meta = {"format": BUNDLE_FORMAT, "model_config": cfg.to_dict(), "pruning": asdict(pruning), "quantized": False}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_zip(path, {"encoder.onnx": encoder, "decoder.onnx": decoder, "wte.npy": wte.getvalue(),
                      "tokenizer.json": tok.to_json().encode(), "vla.json": json.dumps(meta).encode()})  # fmt: skip
    return path


def quantize_bundle(src: str | Path, dst: str | Path) -> Path:
    """The int8 variant: dynamic quantisation (int8 weights, per-call activation scales) of MatMul/Gemm."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    members = _read_zip(Path(src))
    tmp = Path(dst).with_suffix(".tmp-dir")
    tmp.mkdir(parents=True, exist_ok=True)
    for name in ("encoder.onnx", "decoder.onnx"):
        (tmp / name).write_bytes(members[name])
        quantize_dynamic(
            tmp / name, tmp / f"q-{name}", weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"]
        )
        members[name] = (tmp / f"q-{name}").read_bytes()
    meta = json.loads(members["vla.json"])
    meta["quantized"] = True
    members["vla.json"] = json.dumps(meta).encode()
    for leftover in tmp.iterdir():
        leftover.unlink()
    tmp.rmdir()
    _write_zip(Path(dst), members)
    return Path(dst)


def _write_zip(path: Path, members: dict[str, bytes]) -> None:
    # Fixed timestamps: the same weights give the same bytes, so the same sha256.
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, members[name])
    tmp.replace(path)


def _read_zip(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}
