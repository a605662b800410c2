"""Tree attention without copying the KV cache for grouped-query models.

Stock SDPA in transformers handles grouped-query attention (several query
heads per key/value head) in one of two ways: a single query token is packed
onto the KV heads, but a multi-token query with a mask gets `repeat_kv`, which
copies every layer's whole K and V `groups` times per forward. For a tree
verification at 2,000 tokens of context that copy dominates the forward.

`packed_tree_sdpa` packs a multi-token query the same way a single token is
packed: the query heads of one KV group become extra query rows of that KV
head (`[b, kv_heads, groups * q, d]`), and the row's mask is repeated per
group. Same arithmetic, no KV copy. It is registered as an attention
implementation that falls back to stock SDPA whenever it is not a runner's
tree forward, so `model.generate` (the baseline) runs exactly the stock path.

Ragged batch forwards. When the engine's rows send different numbers of tree
tokens, the runner packs them into one sequence ([1, tokens]) so the linear
layers, which dominate a forward, compute no padding. Attention is the one
place where rows must stay apart: `RaggedQueries` says which row and tree
slot each packed token is, the queries are scattered into the padded
[rows, heads, width, dim] layout, attend to their own row's keys under the
batch's 4D tree mask exactly as a padded forward would, and are gathered
back. Padding costs attention only, never the matmuls. When few rows carry
drafts (`planner.split_attention`), even that is avoided: all rows' roots attend in
one call and each drafting row's drafts in a call of its own, over its own
keys, so a plain row never pays for another row's tree.

Exact attention (half-precision models; `AttentionSwitch.exact`). Stock
kernels reduce over the keys in blocks whose bounds depend on how many
queries and keys a call has, so in bf16 a token's output differs by a
rounding step between a one-token plain forward and a tree verification,
and near-ties flip (the token-equality promise breaks). Every decode forward
(plain steps, trees, ragged or split batches, a single row or many) takes an
attention whose every query's output is a function of its own keys and mask
alone, whatever else shares the call, so plain decoding and lookahead are
one computation; prefill keeps stock SDPA (both prefill a prompt alike:
runner.prefill).
- On the CPU, the paged kernel (`paged_attention.py`): float32, with the dot
  products, the normaliser and the weighted sum each in one fixed order over
  the keys, and masked keys adding exact zeros. It reads the pool in place
  for several rows and any view otherwise (`_exact_kernel_sdpa`).
- Elsewhere, or with no compiler, `exact_sdpa`: every query's scores,
  softmax and weighted sum in float64 from the bf16 inputs. A product of two
  bf16 numbers is exact there, and whatever order the sums run in, their
  error is ~2^-50 relative, far below the bf16 step (2^-8) the result is
  rounded to.
"""

from dataclasses import dataclass, field
from itertools import accumulate

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lookahead.model import paged_attention
from lookahead.core.planner import split_attention

NAME = "lookahead_sdpa"


@dataclass
class RaggedQueries:
    """Layout of a ragged forward's packed tokens."""

    rows: int
    width: int  # the widest row's tree; the padded layout attention works in
    row_of: torch.Tensor  # [tokens] the row of each packed token
    slot_of: torch.Tensor  # [tokens] its place in that row's tree
    counts: list[int]  # [rows] each row's tree tokens (packed row after row)
    lengths: list[int]  # [rows] each row's committed KV entries (its tree starts there)
    starts: list[int] = field(init=False)  # [rows] where each row's tokens begin in the packed sequence
    roots: torch.Tensor = field(init=False)  # [rows] the same, as an index on the forward's device
    # Attend row by row, not in the padded layout: the plan's choice where `planner.split_attention` allows it
    # (None: wherever it allows it).
    split: bool | None = None

    def __post_init__(self) -> None:
        self.starts = [0, *accumulate(self.counts[:-1])]
        self.roots = torch.tensor(self.starts, device=self.row_of.device)
        allowed = split_attention(self.rows, sum(c > 1 for c in self.counts))
        assert not self.split or allowed, "split attention needs at most a quarter of the rows drafting"
        self.split = allowed if self.split is None else self.split


@dataclass
class AttentionSwitch:
    """Set by the runner around its own forwards; stock SDPA runs whenever `on` is False."""

    on: bool = False
    ragged: RaggedQueries | None = None
    exact: bool = False  # this forward's attention is exact (see the module docstring; the runner sets it per forward)
    # The batch cache's ForwardPlan when its rows are read in place: the layers' update() then returns the pool
    # itself ([pool_tokens, kv_heads, dim]) and `_paged_sdpa` reads each row at plan.read's offsets.
    paged: object | None = None


def _ragged_sdpa(module, query, key, value, attention_mask, scaling, layout: RaggedQueries, attend=None):
    """query [1, heads, tokens, dim] packed; key/value [rows, kv_heads, kv_len, dim]; mask [rows, 1, width, kv_len]."""
    _, heads, _, d = query.shape
    padded = query.new_zeros((layout.rows, layout.width, heads, d))
    padded[layout.row_of, layout.slot_of] = query[0].transpose(0, 1)  # [tokens, heads, dim]
    out, _ = (attend or _tree_sdpa)(module, padded.transpose(1, 2), key, value, attention_mask, scaling=scaling)
    return out[layout.row_of, layout.slot_of][None], None  # [rows, width, heads, dim] -> [1, tokens, heads, dim]


def _split_sdpa(module, query, key, value, attention_mask, scaling, layout: RaggedQueries):
    """Every row's root in one call; each drafting row's drafts in one call of their own, on its own keys only.

    query [1, heads, tokens, dim] packed; key/value [rows, kv_heads, kv_len, dim]; mask [rows, 1, width, kv_len].
    Row b's keys end at lengths[b] + counts[b]: its committed context and its own tree.
    """
    _, heads, tokens, d = query.shape
    counts, lengths, starts = layout.counts, layout.lengths, layout.starts
    out = query.new_empty((tokens, heads, d))
    root_q = query[0, :, layout.roots].transpose(0, 1)[:, :, None]  # [rows, heads, 1, d]
    root_out, _ = _tree_sdpa(module, root_q, key, value, attention_mask[:, :, :1], scaling=scaling)
    out[layout.roots] = root_out[:, 0]
    for b, c in enumerate(counts):
        if c == 1:
            continue
        s, kv = starts[b], lengths[b] + c
        o, _ = _tree_sdpa(module, query[:, :, s + 1 : s + c], key[b : b + 1, :, :kv], value[b : b + 1, :, :kv],
                          attention_mask[b : b + 1, :, 1:c, :kv], scaling=scaling)
        out[s + 1 : s + c] = o[0]
    return out[None], None


def packed_tree_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    switch = getattr(module, "_lookahead_switch", None)
    if switch is None or not switch.on:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if switch.paged is not None:
        return _paged_sdpa(query, key, value, attention_mask, scaling, switch, kwargs)
    if switch.exact and kwargs.get("softcap") is None and kwargs.get("position_bias") is None:
        native = paged_attention.kernel()
        if (native is not None and native.supports(key.device, key.dtype, key.shape[-1])
                and (attention_mask is None or attention_mask.dtype == torch.bool)):
            return _exact_kernel_sdpa(native, query, key, value, attention_mask, scaling, switch.ragged)
        if switch.ragged is not None:
            return _ragged_sdpa(module, query, key, value, attention_mask, scaling, switch.ragged, exact_sdpa)
        return exact_sdpa(module, query, key, value, attention_mask, scaling=scaling)
    if switch.ragged is not None:
        if switch.ragged.split:
            return _split_sdpa(module, query, key, value, attention_mask, scaling, switch.ragged)
        return _ragged_sdpa(module, query, key, value, attention_mask, scaling, switch.ragged)
    return _tree_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                      is_causal=is_causal, **kwargs)


def _paged_sdpa(query, key, value, attention_mask, scaling, switch: AttentionSwitch, kwargs):
    """key/value: the pool, [pool_tokens, kv_heads, dim], read at the plan's offsets (exact forwards too: the
    kernel's arithmetic is exact); mask bool [rows, 1, width, kv_len]."""
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        raise ValueError("paged attention has no softcap or position bias (runner.pool_layout keeps such models out)")
    return _kernel_sdpa(switch.paged.kernel, query, key, value, switch.paged.read, attention_mask, scaling)


def _exact_kernel_sdpa(native, query, key, value, attention_mask, scaling, ragged: RaggedQueries | None):
    """Exact attention over views, through the paged kernel. key/value [rows, kv_heads, kv_len, dim]; mask bool
    [rows, 1, q or width, kv_len], or None: causal, the queries being the last q keys."""
    q_len, rows, kv_len = query.shape[2], key.shape[0], key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    mask = attention_mask.expand(rows, 1, attention_mask.shape[-2], kv_len)
    if ragged is not None:
        starts, counts = ragged.starts, ragged.counts
    else:
        starts, counts = [r * q_len for r in range(rows)], [q_len] * rows
    return _kernel_sdpa(native, query, key, value, paged_attention.view_read(key, starts, counts), mask, scaling)


def _kernel_sdpa(native, query, key, value, read, mask, scaling):
    """query [b, heads, q, dim], rows' tokens one after another either way: packed ([1, heads, tokens, dim]) or
    padded ([rows, heads, width, dim]). Out [b, q, heads, dim]."""
    b, heads, q_len, d = query.shape
    packed = query.transpose(1, 2).reshape(b * q_len, heads, d)  # [tokens, heads, dim]
    out = native.attend(packed, key, value, read, mask, scaling if scaling is not None else d ** -0.5)
    return out.view(b, q_len, heads, d), None


def _tree_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """[b, heads, q, dim] queries under a 4D boolean mask, GQA-packed (no K/V copy); stock SDPA where that cannot apply."""
    groups = getattr(module, "num_key_value_groups", 1)
    q_len = query.shape[2]
    if (
        groups == 1
        or q_len == 1
        or attention_mask is None
        or attention_mask.dtype != torch.bool
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, _, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    packed_q = query.reshape(b, kv_heads, groups * q_len, d)  # query head h belongs to KV head h // groups
    mask = attention_mask.expand(b, 1, q_len, kv_len)[:, :, None].expand(b, 1, groups, q_len, kv_len)
    out = F.scaled_dot_product_attention(packed_q, key, value, attn_mask=mask.reshape(b, 1, groups * q_len, kv_len),
                                         scale=scaling)
    return out.reshape(b, heads, q_len, d).transpose(1, 2).contiguous(), None  # [b, q, heads, d]


EXACT_CALL_BYTES = 1 << 30  # float64 working set of one exact_sdpa call: more rows than this are taken in turns


def exact_sdpa(module, query, key, value, attention_mask, scaling=None, **_):
    """query [b, heads, q, dim], key/value [b, kv_heads, kv_len, dim], mask bool [b, 1, q, kv_len] or None (causal,
    the queries being the last q keys); out [b, q, heads, dim] in the query's dtype. Float64 throughout (see the
    module docstring); query heads share their KV head by packing, as `_tree_sdpa` does.

    Float64 copies of a whole batch's keys and values at a long context are many times the KV itself (32 rows
    of Qwen-14B at 8k: 21 GiB against 5 GiB); rows are taken in turns so that one call's working set stays near
    EXACT_CALL_BYTES, which bounds the activation peak the KV budget leaves room for. A row's result does not
    depend on which rows share its call (each is its own batch entry of the same kernels)."""
    b, heads, q_len, d = query.shape
    kv_len = key.shape[2]
    row_bytes = 8 * (2 * key.shape[1] * kv_len * d + 3 * heads * q_len * kv_len + heads * q_len * d)
    step = max(1, EXACT_CALL_BYTES // row_bytes)
    if b > step:
        mask = attention_mask
        parts = [_exact_rows(query[i:i + step], key[i:i + step], value[i:i + step],
                             mask if mask is None or mask.shape[0] == 1 else mask[i:i + step], scaling)
                 for i in range(0, b, step)]
        return torch.cat(parts), None
    return _exact_rows(query, key, value, attention_mask, scaling), None


def _exact_rows(query, key, value, attention_mask, scaling):
    b, heads, q_len, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = scaling if scaling is not None else d ** -0.5
    q = query.double().reshape(b, kv_heads, groups * q_len, d)
    scores = (q @ key.double().transpose(-1, -2)) * scale  # [b, kv_heads, groups * q, kv_len]
    if attention_mask is None:
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    mask = attention_mask.expand(b, 1, q_len, kv_len)[:, :, None].expand(b, 1, groups, q_len, kv_len)
    mask = mask.reshape(b, 1, groups * q_len, kv_len)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    out = scores.softmax(-1) @ value.double()  # [b, kv_heads, groups * q, dim]
    return out.to(query.dtype).reshape(b, heads, q_len, d).transpose(1, 2).contiguous()


def install(model: torch.nn.Module, switch) -> bool:
    """Route a stock-SDPA model's attention through `packed_tree_sdpa`; False when it uses something else."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, packed_tree_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    for mod in model.modules():
        if hasattr(mod, "num_key_value_groups"):
            mod._lookahead_switch = switch
    for cfg in {id(c): c for c in _configs(model)}.values():
        cfg._attn_implementation = NAME
    return True


def _configs(model):
    yield model.config
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa":
            yield cfg
