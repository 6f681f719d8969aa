"""The VLA's vocabulary: a byte-level BPE trained here on the demonstrations, plus action tokens.

Torch-free (the edge uses it). One sequence per step:

    prompt:  <bos> instruction-BPE [history: <act> type x y | <act> type text ...] <sep>
    target:  thought-BPE <act> <click>|<scroll> <x_i> <y_j> <eos>
                               <type>|<key> text-BPE <eos>
                               <noop> <eos>

Click coordinates are discretised over the 160x210 task area in bins of `bin_px` pixels (default 5:
32 x-bins, 42 y-bins); a decoded bin means its centre pixel. Special tokens come first in the id space,
in SPECIAL_TOKENS order, so <pad> is 0 whatever the BPE learns.

History: a model whose config sets `history_actions` > 0 sees the latest actions of its episode in its
prompt, oldest first, each as its action tokens (a typed text cut to HISTORY_TEXT_TOKENS). That is how it
knows which step of a multi-step task it is at when the screen alone does not say (click-button-sequence).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from policy.screen import ACTION_TYPES, POSITIONAL_TYPES, SCREEN_H, SCREEN_W
from schemas import Action

PAD, BOS, SEP, ACT, EOS = "<pad>", "<bos>", "<sep>", "<act>", "<eos>"
DEFAULT_SCROLL_DY = 50.0  # the experts scroll by 50 px; the action grammar carries no scroll distance
HISTORY_TEXT_TOKENS = 8  # a typed text or key name in the history is cut to this many BPE tokens
_COORDINATES = re.compile(r"\s*(?:is |are )?(?:at |in )?\(\d+, \d+\)")


def type_token(action_type: str) -> str:
    return f"<{action_type}>"


# The reading encoder's view of the instruction: one id per character, so it can match glyphs to letters
# (a BPE piece of an unseen word has no glyphs to learn from). 0 is padding, 1..95 printable ASCII,
# 96 anything else.
CHAR_VOCAB = 97


def char_ids(text: str, max_chars: int) -> list[int]:
    """The first `max_chars` characters of `text` as ids in [1, CHAR_VOCAB); never empty."""
    ids = [ord(c) - 31 if " " <= c <= "~" else CHAR_VOCAB - 1 for c in text.strip()[:max_chars]]
    return ids or [1]


def special_tokens(bin_px: int) -> list[str]:
    nx, ny = -(-SCREEN_W // bin_px), -(-SCREEN_H // bin_px)
    return (
        [PAD, BOS, SEP, ACT, EOS]
        + [type_token(t) for t in ACTION_TYPES]
        + [f"<x_{i}>" for i in range(nx)]
        + [f"<y_{j}>" for j in range(ny)]
    )


def short_thought(thought: str) -> str:
    """The expert's thought without pixel coordinates: the model says what it targets, the action says where.

    'The link 'Eget' is at (80, 105). Click it.' -> 'The link 'Eget'. Click it.'
    """
    text = _COORDINATES.sub("", thought)
    return re.sub(r"\s+", " ", text.replace(",.", ".")).strip()


class ParseError(ValueError):
    """Generated tokens that do not form an action (the step becomes a noop, and says why)."""


@dataclass(frozen=True)
class Parsed:
    thought: str
    action: Action


class ActionTokenizer:
    """BPE text tokens + action tokens; encode a (thought, action) target, parse generated ids back."""

    def __init__(self, tokenizer: Tokenizer, bin_px: int):
        self.tok = tokenizer
        self.bin_px = bin_px
        self.specials = special_tokens(bin_px)
        ids = [tokenizer.token_to_id(t) for t in self.specials]
        if ids != list(range(len(self.specials))):
            raise ValueError("tokenizer does not hold the action tokens at ids 0..S-1; train it with train_tokenizer")
        self.pad_id, self.bos_id, self.sep_id, self.act_id, self.eos_id = ids[:5]
        self.type_ids = {t: tokenizer.token_to_id(type_token(t)) for t in ACTION_TYPES}
        self.nx, self.ny = -(-SCREEN_W // bin_px), -(-SCREEN_H // bin_px)
        self.x0 = tokenizer.token_to_id("<x_0>")
        self.y0 = tokenizer.token_to_id("<y_0>")

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    # --- encoding ---------------------------------------------------------------------------

    def text_ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def instruction_ids(self, instruction: str, max_tokens: int) -> list[int]:
        """The instruction's BPE ids: the prompt's first part and the encoder's relevance query."""
        return self.text_ids(instruction.strip())[:max_tokens]

    def prompt_ids(self, instruction: str, max_tokens: int, history: Sequence[Action] = (),
                   history_actions: int = 0) -> list[int]:  # fmt: skip
        """<bos> instruction [the last `history_actions` of `history`, oldest first] <sep>."""
        recent = list(history)[-history_actions:] if history_actions else []
        past = [i for action in recent for i in self.action_ids(action, HISTORY_TEXT_TOKENS)]
        return [self.bos_id, *self.instruction_ids(instruction, max_tokens), *past, self.sep_id]

    @staticmethod
    def max_history_tokens(history_actions: int) -> int:
        """The most prompt tokens `history_actions` past actions take (<act> type + 2 coordinates or a text)."""
        return history_actions * (2 + max(2, HISTORY_TEXT_TOKENS))

    def action_ids(self, action: Action, max_text_tokens: int | None = None) -> list[int]:
        """<act> type, then x y (click, scroll) or the text (type) or the key name (key)."""
        ids = [self.act_id, self.type_ids[action.type]]
        if action.type in POSITIONAL_TYPES:
            ids += [self.x0 + self._bin(action.x, self.nx), self.y0 + self._bin(action.y, self.ny)]
        elif action.type in ("type", "key"):
            ids += self.text_ids(action.text if action.type == "type" else action.key)[:max_text_tokens]
        return ids

    def target_ids(self, thought: str, action: Action, max_thought_tokens: int) -> list[int]:
        return [*self.text_ids(short_thought(thought))[:max_thought_tokens], *self.action_ids(action), self.eos_id]

    def _bin(self, pixel: float, bins: int) -> int:
        return min(max(int(float(pixel) // self.bin_px), 0), bins - 1)

    # --- decoding ---------------------------------------------------------------------------

    def parse(self, ids: Iterable[int]) -> Parsed:
        """Generated target ids (without the prompt) -> thought + action. Raises ParseError on bad grammar."""
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        if self.act_id not in ids:
            raise ParseError("no <act> token")
        cut = ids.index(self.act_id)
        thought = self.tok.decode(ids[:cut]).strip()
        rest = ids[cut + 1 :]
        types = {v: k for k, v in self.type_ids.items()}
        if not rest or rest[0] not in types:
            raise ParseError("<act> is not followed by an action type")
        action_type, args = types[rest[0]], rest[1:]
        if action_type in POSITIONAL_TYPES:
            if len(args) < 2 or not (0 <= args[0] - self.x0 < self.nx) or not (0 <= args[1] - self.y0 < self.ny):
                raise ParseError(f"<{action_type}> needs an x token then a y token")
            x = (args[0] - self.x0 + 0.5) * self.bin_px
            y = (args[1] - self.y0 + 0.5) * self.bin_px
            dy = DEFAULT_SCROLL_DY if action_type == "scroll" else 0.0
            return Parsed(thought, Action(action_type, x=min(x, SCREEN_W - 1), y=min(y, SCREEN_H - 1), scroll_dy=dy))
        if any(i < len(self.specials) for i in args):
            raise ParseError(f"<{action_type}> arguments hold action tokens")
        text = self.tok.decode(args)
        if action_type == "type":
            return Parsed(thought, Action("type", text=text))
        if action_type == "key":
            return Parsed(thought, Action("key", key=text))
        return Parsed(thought, Action(action_type))

    def allowed_next(self, generated: list[int], max_thought_tokens: int, max_text_tokens: int) -> np.ndarray:
        """(V,) bool mask of the tokens the action grammar allows after `generated` (target ids so far).

        Greedy decoding under this mask always yields a parseable action; the torch and onnxruntime
        decoders both use it, so they stay token-for-token comparable.
        """
        v, s = self.vocab_size, len(self.specials)
        mask = np.zeros(v, dtype=bool)
        if self.act_id not in generated:
            mask[self.act_id] = True
            if len(generated) < max_thought_tokens:
                mask[s:] = True  # thought text
            return mask
        after = generated[generated.index(self.act_id) + 1 :]
        if not after:
            mask[list(self.type_ids.values())] = True
            return mask
        kind = {v: k for k, v in self.type_ids.items()}[after[0]]
        if kind in POSITIONAL_TYPES and len(after) == 1:
            mask[self.x0 : self.x0 + self.nx] = True
        elif kind in POSITIONAL_TYPES and len(after) == 2:
            mask[self.y0 : self.y0 + self.ny] = True
        elif kind in ("type", "key") and len(after) - 1 < max_text_tokens:
            mask[s:] = True
            mask[self.eos_id] = len(after) > 1  # at least one text token
        else:
            mask[self.eos_id] = True
        return mask

    # --- persistence ------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps({"bin_px": self.bin_px, "tokenizer": json.loads(self.tok.to_str())})

    @classmethod
    def from_json(cls, text: str) -> ActionTokenizer:
        data = json.loads(text)
        return cls(Tokenizer.from_str(json.dumps(data["tokenizer"])), int(data["bin_px"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> ActionTokenizer:
        return cls.from_json(Path(path).read_text())


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, bin_px: int = 5) -> ActionTokenizer:
    """Byte-level BPE over `texts` (instructions, short thoughts, typed text, keys); any string still encodes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens(bin_px),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return ActionTokenizer(tok, bin_px)
