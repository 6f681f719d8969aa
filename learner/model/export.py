"""Export the VLA for the edge: three ONNX graphs, the KV cache owned by the runtime, in one bundle file.

    encoder.onnx   image (1, 3, 210, 160) uint8, instruction_ids (1, L) int64 (the "patch" encoder) or
                   instruction_chars (1, Lc) int64 (the "reading" encoder: policy.tokens.char_ids)
                   -> patches (1, N, d), relevance (1, N), pointer_keys (1, N, r)
                      (a click-map model: click_map (1, 2R, 2C) log-probabilities instead of pointer_keys)
    prefill.onnx   inputs_embeds (T, d) of [kept patches | prompt], pointer_keys (k, r), in_col (k, C), in_row (k, R)
                   [, kept_relevance (k,): a model with pointer_relevance] (a click-map model: no pointer inputs,
                   and its logits are the LM head's: the runtime scores the coordinate tokens from the map)
                   -> logits (1, V) of the last position, present_key_0, present_value_0, ... (1, H, T, d/H)
    decode.onnx    inputs_embeds (1, d), positions (1,), seqlens_k (1,) int32, total_len () int32, the pointer
                   inputs, cache_key_0, cache_value_0, ... (1, H, capacity, d/H)
                   -> logits (1, V), present_key_0, ... (the cache buffers, the token's keys/values appended)

The runtime copies the prefill's keys/values into its cache buffers once per step and binds the buffers as
both the decode graph's cache inputs and its present outputs; the decode graph's attention is onnxruntime's
GroupQueryAttention, which appends in place. Nothing is copied or grown per token: a 356-token prefill
plus 16 decoded tokens went from 23.3 to 17-20 ms (one thread; decode 0.60 -> ~0.30 ms per token), where
the previous graph concatenated the whole cache into fresh outputs on every token. The prefill builds its
causal mask once as an additive bias (masked_fill per layer was a Where over (H, T, T), a fifth of the
matmul time), runs the last layer's attention and MLP for the last position only, and keeps hidden states
2-D so that each linear is a single Gemm. The pointer's logsumexps are computed as two small matmuls.

Both graphs re-implement GPT-2's forward over the trained transformers modules (HF cache classes export
poorly); `check_decoder_parity` proves prefill + decode equal the transformers forward. Token embeddings
for decode steps are looked up by the runtime from `wte.npy`.

The bundle (`.vla`, a zip) holds the graphs, wte.npy, tokenizer.json and vla.json (model + pruning
config); its sha256 is what a ModelVersionEvent names. `quantize_bundle` writes the int8 variant.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn
from torch.onnx.symbolic_helper import _optional_input_placeholder_tensor

from learner.model.vla import MEMBERSHIP, VLA
from policy.bundle import BUNDLE_FORMAT, GRAPHS, WEIGHTS, read_members, write_bundle
from policy.pruning import PruningConfig
from policy.runtime import cache_names, membership
from policy.screen import SCREEN_H, SCREEN_W
from policy.tokens import ActionTokenizer

OPSET = 17
MIN_SHARED_BYTES = 1024  # initializers moved to the shared weights file; smaller ones stay in their graph
CAUSAL_BLOCKS = 2  # query blocks of the prefill attention (PrefillGraph); 4 measured no faster than 2


def encoder_text_input(model: VLA) -> str:
    """The encoder graph's instruction input: what the model's encoder reads of the instruction."""
    return "instruction_chars" if model.cfg.encoder == "reading" else "instruction_ids"


class EncoderGraph(nn.Module):
    """One instruction input (encoder_text_input): each encoder reads either the BPE ids or the characters."""

    def __init__(self, model: VLA):
        super().__init__()
        self.encoder = model.encoder
        self.pointer_k = None if model.cfg.click_map else model.pointer_k

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, ...]:
        encoded = self.encoder(image, text, text)
        if self.pointer_k is None:  # a click-map model: the map scores the coordinates at the runtime
            return encoded.patches, encoded.relevance, encoded.click_map
        # Pointer keys of every patch (a per-token linear map): the runtime keeps the rows of the kept patches.
        return encoded.patches, encoded.relevance, self.pointer_k(encoded.patches)


def encoder_outputs(model: VLA) -> list[str]:
    """The encoder graph's outputs: the third is the click map of a click-map model, else the pointer keys."""
    return ["patches", "relevance", "click_map" if model.cfg.click_map else "pointer_keys"]


class CachedAttention(torch.autograd.Function):
    """One token's causal self-attention over a fixed-capacity cache, writing its key and value into it.

    Exported as onnxruntime's `com.microsoft.GroupQueryAttention` (as many KV heads as query heads) on the
    packed q|k|v: bound to the same buffers as its past and present cache, it appends the new key/value
    in place, so a decode step neither copies nor grows the cache, and one fused node replaces a dozen
    (split, scores, softmax, concat...). In torch it is the same math written out, which
    `check_decoder_parity` holds to transformers.
    """

    @staticmethod
    def forward(ctx, qkv, cache_k, cache_v, seqlens_k, total_len, heads: int, hd: int):  # noqa: ANN001
        # qkv: (1, 1, 3 * H * hd); cache_*: (1, H, capacity, hd); seqlens_k: (1,) int32 = total - 1; total_len: () int32
        total = int(total_len)
        q, k, v = (x.reshape(1, heads, 1, hd) for x in qkv.split(heads * hd, dim=-1))  # one token: no transpose
        present_k, present_v = cache_k.clone(), cache_v.clone()
        present_k[:, :, total - 1 : total], present_v[:, :, total - 1 : total] = k, v
        scores = (q @ present_k[:, :, :total].transpose(-1, -2)) / math.sqrt(hd)  # (1, H, 1, total)
        out = (scores.softmax(-1) @ present_v[:, :, :total]).reshape(1, 1, heads * hd)
        return out, present_k, present_v

    @staticmethod
    def symbolic(g, qkv, cache_k, cache_v, seqlens_k, total_len, heads: int, hd: int):  # noqa: ANN001
        absent = _optional_input_placeholder_tensor(g)  # key and value: packed in the query input
        return g.op("com.microsoft::GroupQueryAttention", qkv, absent, absent, cache_k, cache_v, seqlens_k, total_len,
                    num_heads_i=heads, kv_num_heads_i=heads, scale_f=1.0 / math.sqrt(hd), outputs=3)  # fmt: skip


class _Decoder(nn.Module):
    """The trained GPT-2 modules, with hidden states kept 2-D (T, d): each linear is then one Gemm, where
    3-D inputs cost a Reshape on either side of it (54 of a 167-node decode step)."""

    def __init__(self, model: VLA):
        super().__init__()
        gpt = model.decoder
        self.model = model
        self.blocks = gpt.transformer.h
        self.wpe = gpt.transformer.wpe
        self.ln_f = gpt.transformer.ln_f
        self.heads, self.d = model.cfg.n_heads, model.cfg.d_model
        self.hd = self.d // self.heads

    def rest_of_block(self, block: nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The residual after attention (y: (T, d), heads merged), then the MLP."""
        h = h + linear(block.attn.c_proj, y)
        return h + linear(block.mlp.c_proj, block.mlp.act(linear(block.mlp.c_fc, block.ln_2(h))))

    def logits(self, h: torch.Tensor, pointer: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(1, d) last hidden state -> (1, V): VLA.output_logits, its pointer logsumexps written as matmuls; a
        click-map model's LM head alone (the runtime scores its coordinates from the encoder's map).

        pointer: () for a click-map model; else (pointer_keys (k, r), in_col (k, C), in_row (k, R)) and, for a
        model with pointer_relevance, the kept patches' relevance (k,).

        logsumexp_i(s_i + bias_ic), bias 0 inside column c and -M outside, equals
        max + log(E @ in_col + e^-M * (sum(E) - E @ in_col)) with E = exp(s - max): two small matmuls
        instead of exponentiating the (k, C) and (k, R) sums every decoded token.
        """
        model, h = self.model, self.ln_f(h)
        if not pointer:
            return model.decoder.lm_head(h)
        pointer_keys, in_col, in_row, *kept_relevance = pointer
        s = model.pointer_q(h) @ pointer_keys.transpose(0, 1) / math.sqrt(pointer_keys.shape[-1])  # (1, k)
        if kept_relevance:
            s = s + model.score_bias(kept_relevance[0])[None, :]
        top = s.max(dim=-1, keepdim=True).values
        e = (s - top).exp()
        total = e.sum(dim=-1, keepdim=True)

        def logsumexp_over(member: torch.Tensor) -> torch.Tensor:  # member: (k, C) 0/1
            inside = e @ member
            return top + (inside + math.exp(-MEMBERSHIP) * (total - inside)).log()

        col, row = logsumexp_over(in_col), logsumexp_over(in_row)  # (1, C), (1, R)
        fine = model.fine(h)
        fx, fy = fine[:, : model.bins_per_patch], fine[:, model.bins_per_patch :]
        x_logits = (col[..., None] + fx[:, None, :]).flatten(-2)  # (1, C * bpp)
        y_logits = (row[..., None] + fy[:, None, :]).flatten(-2)
        lm = model.decoder.lm_head(h)
        return torch.cat([lm[:, : model.x0], x_logits, y_logits, lm[:, model.y0 + y_logits.shape[-1] :]], dim=-1)


class PrefillGraph(_Decoder):
    """GPT-2 over the whole prompt (empty cache): the last position's logits and every layer's keys/values."""

    def forward(
        self,
        inputs_embeds: torch.Tensor,  # (T, d): the edge runs one sequence at a time
        *pointer: torch.Tensor,  # pointer_keys (k, r), in_col (k, C), in_row (k, R)[, kept_relevance (k,)]; none
        # for a click-map model (_Decoder.logits)
    ) -> tuple[torch.Tensor, ...]:
        positions = torch.arange(inputs_embeds.shape[0])
        h = inputs_embeds + self.wpe(positions)
        # The causal mask as an additive bias built once: masked_fill per layer was a Where over (H, T, T)
        # costing a fifth of the prefill's matmul time. exp(s - 1e9) is exactly 0, as exp(-inf) is.
        mask = (positions[None, :] > positions[:, None]).float() * -1e9  # (T, T)
        presents = []
        for layer, block in enumerate(self.blocks):
            qkv = linear(block.attn.c_attn, block.ln_1(h)).split(self.d, dim=-1)
            q, k, v = (x.reshape(-1, self.heads, self.hd).transpose(0, 1) for x in qkv)  # (H, T, hd)
            presents += [k[None], v[None]]
            if layer == len(self.blocks) - 1:
                # Only the last position's output is read, and the last layer's keys and values are already
                # in the cache: its attention and MLP run for that one position (a sixth of a prefill).
                h, y = h[-1:], self.attend(q[:, -1:], k, v, mask[-1:])
            else:
                # Queries in causal blocks, each seeing keys up to its own end: with 2 blocks a quarter of
                # the score matrix (half of its masked triangle) is never computed; prefill -0.7 ms.
                t = q.shape[1]
                ends = [t * (b + 1) // CAUSAL_BLOCKS for b in range(CAUSAL_BLOCKS)]
                starts = [0, *ends[:-1]]
                y = torch.cat([self.attend(q[:, a:b], k[:, :b], v[:, :b], mask[a:b, :b])
                               for a, b in zip(starts, ends, strict=True)], dim=1)  # fmt: skip
            h = self.rest_of_block(block, h, y.transpose(0, 1).reshape(-1, self.d))
        # (1, V), (1, H, T, hd) per layer
        return (self.logits(h, pointer), *presents)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(hd) + bias) v: (H, Tq, hd) queries, (H, Tk, hd) keys/values, (Tq, Tk) bias."""
        return ((q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + bias).softmax(-1) @ v


class DecodeGraph(_Decoder):
    """GPT-2 for one token against the runtime's KV cache, which its attention appends to in place."""

    def forward(
        self,
        inputs_embeds: torch.Tensor,  # (1, d)
        positions: torch.Tensor,  # (1,) int64: the token's absolute position
        seqlens_k: torch.Tensor,  # (1,) int32: cached tokens (GroupQueryAttention's total - 1)
        total_len: torch.Tensor,  # () int32: cached tokens + 1
        *rest: torch.Tensor,  # the pointer inputs (PrefillGraph; none for a click-map model), key_0, value_0, ...
    ) -> tuple[torch.Tensor, ...]:
        split = len(rest) - 2 * len(self.blocks)
        pointer, cache = rest[:split], rest[split:]  # cache buffers: (1, H, capacity, hd)
        h = inputs_embeds + self.wpe(positions)
        presents = []
        for layer, block in enumerate(self.blocks):
            qkv = linear(block.attn.c_attn, block.ln_1(h))[None]  # (1, 1, 3d)
            y, key, value = CachedAttention.apply(qkv, cache[2 * layer], cache[2 * layer + 1], seqlens_k, total_len,
                                                  self.heads, self.hd)  # fmt: skip
            presents += [key, value]
            h = self.rest_of_block(block, h, y[0])
        # presents: the cache buffers, filled
        return (self.logits(h, pointer), *presents)


def linear(conv1d: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' Conv1D as x @ W + b: its forward flattens to 2-D and back, two reshapes per layer."""
    return x @ conv1d.weight + conv1d.bias


class CachedDecoder:
    """PrefillGraph + DecodeGraph in torch, driven the way the edge runtime drives their ONNX twins."""

    def __init__(self, model: VLA, kept: torch.Tensor, pointer_keys: torch.Tensor, kept_relevance: torch.Tensor,
                 capacity: int):  # fmt: skip
        self.prefill, self.decode = PrefillGraph(model).eval(), DecodeGraph(model).eval()
        cfg = model.cfg
        self.pointer = ()
        if not cfg.click_map:
            in_col, in_row = membership(kept.numpy(), model.cols, model.rows)
            self.pointer = (pointer_keys, torch.from_numpy(in_col), torch.from_numpy(in_row),
                            *((kept_relevance,) if cfg.pointer_relevance else ()))  # fmt: skip
        shape = (1, cfg.n_heads, capacity, cfg.d_model // cfg.n_heads)
        self.cache = [torch.zeros(shape) for _ in range(2 * cfg.n_layers)]
        self.length = 0

    def start(self, embeds: torch.Tensor) -> torch.Tensor:
        """(T, d) prompt embeddings -> (1, V) logits of its last position; fills the cache."""
        logits, *presents = self.prefill(embeds, *self.pointer)
        self.length = embeds.shape[0]
        for buffer, present in zip(self.cache, presents, strict=True):
            buffer[:, :, : self.length] = present
        return logits

    def advance(self, embed: torch.Tensor) -> torch.Tensor:
        """(1, d) embedding of the next token -> its (1, V) logits."""
        position = self.length
        self.length += 1
        seqlens_k, total = torch.tensor([position], dtype=torch.int32), torch.tensor(self.length, dtype=torch.int32)
        logits, *self.cache = self.decode(embed, torch.tensor([position]), seqlens_k, total, *self.pointer, *self.cache)
        return logits


def check_decoder_parity(model: VLA, seed: int = 0, atol: float = 1e-4) -> float:
    """Max |prefill + 3 cached decode steps - transformers forward| over the last-position logits."""
    gen = torch.Generator().manual_seed(seed)
    embeds = torch.randn(1, 12, model.cfg.d_model, generator=gen)
    kept = torch.tensor([3, 40, 41, 200, 300])
    relevance = torch.randn(1, len(kept), generator=gen)
    pointer = None if model.cfg.click_map else model.pointer_targets(embeds[:, :5], kept[None], relevance)
    decoder = CachedDecoder(model, kept, pointer and pointer.keys[0], relevance[0], capacity=16)
    worst = 0.0
    with torch.inference_mode():
        logits = decoder.start(embeds[0, :9])
        for t in range(9, 12):
            hidden = model.decoder.transformer(inputs_embeds=embeds[:, :t]).last_hidden_state[:, -1:]
            want = model.output_logits(hidden, pointer)[:, 0]
            worst = max(worst, float((logits - want).abs().max()))
            logits = decoder.advance(embeds[0, t : t + 1])
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
    text_input = encoder_text_input(net)
    text = torch.randint(10, 90 if text_input == "instruction_chars" else cfg.vocab_size, (1, 7))
    outputs = encoder_outputs(net)
    encoder = _export(
        EncoderGraph(net), (image, text), ["image", text_input], outputs,
        {"image": {0: "batch"}, text_input: {0: "batch", 1: "length"}, **{name: {0: "batch"} for name in outputs}},
    )  # fmt: skip
    kept, tokens, capacity = torch.tensor([0, 5, 9, 30]), 5, 9
    pointer, pointer_names = (), []
    if not cfg.click_map:
        in_col, in_row = membership(kept.numpy(), net.cols, net.rows)
        pointer = (net.pointer_k(torch.randn(len(kept), cfg.d_model)), torch.from_numpy(in_col),
                   torch.from_numpy(in_row), *((torch.randn(len(kept)),) if cfg.pointer_relevance else ()))  # fmt: skip
        pointer_names = ["pointer_keys", "in_col", "in_row", *(["kept_relevance"] if cfg.pointer_relevance else [])]
    per_kept = {name: {0: "kept"} for name in pointer_names}
    present_names = [f"present_{name}" for name in cache_names(cfg.n_layers)]
    prefill = _export(
        PrefillGraph(net), (torch.randn(tokens, cfg.d_model), *pointer), ["inputs_embeds", *pointer_names],
        ["logits", *present_names],
        {"inputs_embeds": {0: "tokens"}, **per_kept, **{name: {2: "tokens"} for name in present_names}},
    )  # fmt: skip
    cache = [torch.zeros(1, cfg.n_heads, capacity, cfg.d_model // cfg.n_heads) for _ in range(2 * cfg.n_layers)]
    cache_inputs = [f"cache_{name}" for name in cache_names(cfg.n_layers)]
    step = (torch.randn(1, cfg.d_model), torch.tensor([tokens]), torch.tensor([tokens], dtype=torch.int32),
            torch.tensor(tokens + 1, dtype=torch.int32))  # fmt: skip
    decode = _export(
        DecodeGraph(net), (*step, *pointer, *cache),
        ["inputs_embeds", "positions", "seqlens_k", "total_len", *pointer_names, *cache_inputs],
        ["logits", *present_names],
        {**per_kept, **{name: {2: "capacity"} for name in cache_inputs + present_names}},
    )  # fmt: skip
    wte = io.BytesIO()
    np.save(wte, net.wte.weight.detach().numpy().astype(np.float32))
    meta = {"format": BUNDLE_FORMAT, "model_config": cfg.to_dict(), "pruning": asdict(pruning), "quantized": False}
    graphs = share_weights({"encoder.onnx": encoder, "prefill.onnx": prefill, "decode.onnx": decode})
    return write_bundle(path, {**graphs, "wte.npy": wte.getvalue(), "tokenizer.json": tok.to_json().encode(),
                      "vla.json": json.dumps(meta).encode()})  # fmt: skip


def quantize_bundle(src: str | Path, dst: str | Path) -> Path:
    """The int8 variant: dynamic quantisation (int8 weights, per-call activation scales) of MatMul/Gemm."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    members = read_members(src)
    weights = members.pop(WEIGHTS)
    tmp = Path(dst).with_suffix(".tmp-dir")
    tmp.mkdir(parents=True, exist_ok=True)
    for name in GRAPHS:
        (tmp / name).write_bytes(inline_weights(members[name], weights))
        quantize_dynamic(
            tmp / name, tmp / f"q-{name}", weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"]
        )
        members[name] = (tmp / f"q-{name}").read_bytes()
    members.update(share_weights({name: members[name] for name in GRAPHS}))
    meta = json.loads(members["vla.json"])
    meta["quantized"] = True
    members["vla.json"] = json.dumps(meta).encode()
    for leftover in tmp.iterdir():
        leftover.unlink()
    tmp.rmdir()
    return write_bundle(dst, members)


def share_weights(graphs: dict[str, bytes]) -> dict[str, bytes]:
    """The graphs with every initializer of MIN_SHARED_BYTES or more moved into one external-data file,
    WEIGHTS, each distinct tensor stored once: prefill and decode run the same weights, and embedding
    them in both graphs made the bundle (and the runtime's memory) 1.7x larger."""
    blob, offsets, shared = bytearray(), {}, {}
    for name, data in graphs.items():
        model = onnx.load_from_string(data)
        for init in model.graph.initializer:
            raw = numpy_helper.to_array(init).tobytes()
            if len(raw) < MIN_SHARED_BYTES:
                continue
            key = (init.data_type, tuple(init.dims), hashlib.sha256(raw).digest())
            if key not in offsets:
                blob += bytes(-len(blob) % 64)  # aligned, so the runtime can use the tensors where they lie
                offsets[key] = len(blob)
                blob += raw
            external = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
            external.data_location = onnx.TensorProto.EXTERNAL
            for field, value in (("location", WEIGHTS), ("offset", offsets[key]), ("length", len(raw))):
                entry = external.external_data.add()
                entry.key, entry.value = field, str(value)
            init.CopyFrom(external)
        shared[name] = model.SerializeToString()
    return {**shared, WEIGHTS: bytes(blob)}


def inline_weights(graph: bytes, weights: bytes) -> bytes:
    """share_weights undone for one graph: its external initializers embedded again (for the quantiser)."""
    model = onnx.load_from_string(graph)
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            where = {entry.key: entry.value for entry in init.external_data}
            offset, length = int(where["offset"]), int(where["length"])
            init.raw_data = weights[offset : offset + length]
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]
    return model.SerializeToString()
