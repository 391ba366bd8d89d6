"""Generated models that are, in effect, a bigram table: sampled output that is genuinely random,
and a draft that agrees with its target on a chosen share of positions.

The construction (``ModelSpec.successors`` = K > 0, ``ModelSpec.active_tokens`` = A):

- The first A word tokens of the vocabulary are active; each owns one dimension ("slot") of the
  hidden state, and every other token shares slot ``id % A``.
- ``token_embd`` row c carries ``BIGRAM_EMBEDDING`` in dimension ``slot(c)`` over its random
  weights: the layers (random, ~0.02) barely move the residual stream, so the final RMS norm
  leaves about ``sqrt(n_embd)`` in that one dimension: the model reads only the current token.
- Slot s has K successors. The first ones follow a single cycle through all A active tokens, so
  greedy decoding walks every slot in turn; the others are drawn at random. ``output.weight``
  row v holds, in dimension s, the logit of v after s divided by ``sqrt(n_embd)``:
  ``FIRST_LOGIT`` for the first successor, ``FIRST_LOGIT - gap`` for the others, ``gap``
  chosen so that the first takes ``FIRST_SHARE`` at ``TEMPERATURE``; every other logit is 0
  (under llama-server's default top-k, top-p and min-p all K successors stay in play).
- ``agree_share``: the share of slots whose first successor this file's drafts keep. A target
  keeps all (1.0); a draft model, built from the same table (its seed is fixed), replaces the
  first successor of the other slots with an active token outside the target's K. In a target
  with an MTP head the output head keeps the whole table and the share is the head's: its
  input projection maps each slot to itself, or for the other slots to the slot whose first
  successor is that other token (the embedding half only; the hidden half is zero).

Greedy decoding then accepts a drafted position as often as the share, and sampling at 0.7
only where the target also sampled its first successor (0.7 of those); with llama-server's
3-token drafts a share of 0.95 accepts about 0.9 of drafted tokens greedy and 0.45 sampled.
The sampled text is a random walk over A tokens, which n-gram lookup cannot predict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from support.ggufgen import ModelSpec

BIGRAM_EMBEDDING = 100.0
FIRST_LOGIT = 10.0
TEMPERATURE = 0.7
FIRST_SHARE = 0.7
"""The first successor's probability at ``TEMPERATURE`` (each other successor shares the rest)."""
DRAFT_SHARE = 0.95
"""A draft's default share: greedy acceptance about 0.9 with llama-server's 3-token drafts."""
TABLE_SEED = 56
DRAFT_SEED = 57
"""Which slots a draft disagrees on: the same for every file of one table and share."""


@dataclass(frozen=True)
class BigramTable:
    """The output head's successor slots per slot (column 0 the first), the slot whose
    successors the MTP head's input projection picks for each slot, and the active ids."""

    successors: np.ndarray
    mtp_slots: np.ndarray
    active_ids: np.ndarray

    @property
    def n_slots(self) -> int:
        return len(self.active_ids)


def logit_gap(successors: int) -> float:
    """The first successor's logit lead that gives it ``FIRST_SHARE`` at ``TEMPERATURE``."""
    return TEMPERATURE * math.log(FIRST_SHARE * (successors - 1) / (1 - FIRST_SHARE))


def table_for(spec: ModelSpec, first_word_id: int, n_vocab: int) -> BigramTable:
    """The table of ``spec`` (``first_word_id``: where its vocabulary's words start)."""
    n_slots, k = spec.active_tokens, spec.successors
    if spec.agree_token is not None:
        raise ValueError("successors and agree_token are two constructions: pick one")
    if not 2 <= k < n_slots <= min(spec.n_embd, n_vocab - first_word_id):
        raise ValueError(
            f"{n_slots} active tokens need 2 <= successors ({k}) < them <= n_embd "
            f"({spec.n_embd}) and the vocabulary's words ({n_vocab - first_word_id})"
        )
    rng = np.random.default_rng(TABLE_SEED)
    order = rng.permutation(n_slots)
    table = np.zeros((n_slots, k), dtype=np.int64)
    table[order, 0] = np.roll(order, -1)
    for slot in range(n_slots):
        others = np.setdiff1d(np.arange(n_slots), [table[slot, 0]])
        table[slot, 1:] = rng.choice(others, k - 1, replace=False)
    drafted = _with_share(table, spec.agree_share)
    active_ids = np.arange(first_word_id, first_word_id + n_slots)
    if not getattr(spec, "nextn_layers", 0):
        return BigramTable(drafted, np.arange(n_slots), active_ids)
    # A target with an MTP head keeps the whole table; the head drafts from the slot whose
    # first successor is the drafted one (the first successors are one cycle: invertible).
    before = np.argsort(table[:, 0])
    return BigramTable(table, before[drafted[:, 0]], active_ids)


def _with_share(table: np.ndarray, agree_share: float) -> np.ndarray:
    """``table`` with the first successor of ``1 - agree_share`` of its slots replaced by a slot
    outside that slot's successors."""
    n_slots = len(table)
    rng = np.random.default_rng(DRAFT_SEED)
    disagreeing = rng.permutation(n_slots)[: round((1 - agree_share) * n_slots)]
    drafted = table.copy()
    for slot in disagreeing:
        drafted[slot, 0] = rng.choice(np.setdiff1d(np.arange(n_slots), table[slot]))
    return drafted


def bigram_tensor(name: str, data: np.ndarray, table: BigramTable) -> np.ndarray:
    """The edits of ``name`` (numpy order: rows are tokens); other tensors pass unchanged."""
    n_vocab, n_embd = data.shape if data.ndim == 2 else (0, 0)
    if name == "token_embd.weight":
        data = data.copy()
        data[np.arange(n_vocab), _slots(n_vocab, table)] = BIGRAM_EMBEDDING
    elif name == "output.weight":
        # Zero beside the table: random rows would add logit noise of ~0.02 * sqrt(n_embd).
        data = np.zeros_like(data)
        slots = np.arange(table.n_slots)
        rest = FIRST_LOGIT - logit_gap(table.successors.shape[1])
        for column, logit in enumerate([FIRST_LOGIT] + [rest] * (table.successors.shape[1] - 1)):
            rows = table.active_ids[table.successors[:, column]]
            data[rows, slots] = logit / math.sqrt(n_embd)
    elif name.endswith("nextn.eh_proj.weight"):
        # Its input is [RMS-normed embedding, normed hidden]: carry the embedding's slot s
        # (sqrt(n_embd) there) to slot mtp_slots[s] at the embedding's own scale.
        data = np.zeros_like(data)
        data[table.mtp_slots, np.arange(table.n_slots)] = BIGRAM_EMBEDDING / math.sqrt(n_embd)
    return data


def _slots(n_vocab: int, table: BigramTable) -> np.ndarray:
    """The slot of every token: active tokens their own, the rest ``id % A``."""
    slots = np.arange(n_vocab) % table.n_slots
    slots[table.active_ids] = np.arange(table.n_slots)
    return slots
