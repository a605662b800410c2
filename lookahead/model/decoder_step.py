"""One decode step of a Llama-family decoder in a few dispatched ops a layer.

The engine's hot loop is one forward a step: every running row's root and
drafts through every layer. Hugging Face's modeling code runs it in about a
hundred ops a layer (views, casts, the mask and cache plumbing, one matmul
per projection, the per-linear reshapes of the fast and exact paths): 107 a
layer for a 1-row verify of a 28-layer Qwen2, measured with the profiler. On
a GPU each op is a kernel launch or at least a trip through the dispatcher,
and a 7B step then costs tens of milliseconds of Python where reading the
weights takes three (issue 37's section C). This module runs the same
arithmetic with the fewest ops the layer allows:

    x ─ rms_norm ─ qkv (one fused linear) ─ rope on q and k at once ─ K, V into the pool
      ─ attention over the pool ─ o ─ + x ─ rms_norm ─ gate_up (one fused linear) ─ silu · up ─ down ─ + x

- The fused weights are the model's own: q, k and v (gate and up) are
  concatenated once and the model's modules are left holding views of the
  concatenation, so no weight is held twice.
- Linears take the same per-device paths as the model's own (fast_linear:
  the CPU's timed `W @ x.T` or packed weights, the exact kernels), called on
  2-D activations with nothing reshaped (`FastLinears.linear2d`).
- RoPE is computed once a step by the model's own rotary module (any scaling
  it implements) and applied as `x * cos + roll(x) * sin'`, with the sign of
  `rotate_half` folded into `sin'`: the same products and sums, so the same
  bits.
- RMSNorm is `F.rms_norm` (one op): in float32 it is bitwise HF's; in half
  precision it is taken as HF takes it (normalise in float32, round, then
  scale), four ops.
- Attention reads the batch cache's pool in place through the paged kernel
  on the CPU (one row too); elsewhere a row's range is a view and several
  rows are gathered, then SDPA (or the exact float64 path) in the padded
  layout, as attention.py does.

Everything a step needs from the host (token ids, positions, the tree mask,
the pool slots) is made before the first layer; the layers themselves read
nothing back and branch on nothing but shapes, so the step is what a CUDA
graph can capture once its inputs sit in static buffers.

It covers the models whose decoder is this shape: Llama, Qwen2, Qwen3 (with
its q/k norms), Mistral without a sliding window inside its context. Any
other model, or a model split over devices, keeps the Hugging Face forward
(`DecoderStep.of` returns None), as does everything but the decode step
(prefill, the single-request `verify`). `LOOKAHEAD_DECODER_STEP=0` turns it
off.
"""

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lookahead.model import attention

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
ENV = "LOOKAHEAD_DECODER_STEP"


@dataclass
class StepLayer:
    """One decoder layer's weights as the step uses them."""

    ln1: torch.Tensor  # [hidden] input_layernorm
    ln2: torch.Tensor  # [hidden] post_attention_layernorm
    qkv: torch.nn.Linear  # [(heads + 2 kv_heads) * head_dim, hidden]
    o: torch.nn.Linear  # [hidden, heads * head_dim]
    gate_up: torch.nn.Linear  # [2 intermediate, hidden]
    down: torch.nn.Linear  # [hidden, intermediate]
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3)
    k_norm: torch.Tensor | None


@dataclass
class StepBatch:
    """What one step sends, made on the host before the first layer (every tensor on the model's device)."""

    ids: torch.Tensor  # [tokens] root and draft tokens, row after row (padded or packed)
    positions: torch.Tensor  # [tokens]
    mask: torch.Tensor  # [rows, 1, width, kv_len] bool: may attend
    dst: torch.Tensor  # [tokens] pool slot each token's key and value go to
    rows: int
    width: int
    ragged: attention.RaggedQueries | None  # packed rows' layout, None when padded (rows x width)
    lone: bool = False  # one token and a padding copy: the CPU's `W @ x.T` pair for a lone row (fast_linear)


def _fuse(mods: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One linear over the rows of `mods`' weights, the modules left holding views of it (no weight twice)."""
    weight = torch.cat([m.weight.detach() for m in mods])
    biased = [m.bias is not None for m in mods]
    assert all(biased) or not any(biased), "fused projections have biases on all or none"
    bias = torch.cat([m.bias.detach() for m in mods]) if all(biased) else None
    fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    fused.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        fused.bias = torch.nn.Parameter(bias, requires_grad=False)
    at = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[at : at + n], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[at : at + n], requires_grad=False)
        at += n
    return fused


class DecoderStep:
    def __init__(self, model: torch.nn.Module) -> None:
        """Use `of`: it checks the model first."""
        cfg = model.config.get_text_config()
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm.weight
        self.eps = cfg.rms_norm_eps
        self.lm_head = model.lm_head
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = inner.layers[0].self_attn.scaling
        self.half = self.embed.weight.dtype in (torch.bfloat16, torch.float16)
        self.layers: list[StepLayer] = []
        self.replaced: list[torch.nn.Linear] = []  # the model's own projections, now views of the fused weights
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(StepLayer(
                layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                _fuse([a.q_proj, a.k_proj, a.v_proj]), a.o_proj, _fuse([m.gate_proj, m.up_proj]), m.down_proj,
                getattr(getattr(a, "q_norm", None), "weight", None), getattr(getattr(a, "k_norm", None), "weight", None)))
            self.replaced += [a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj]
        d = self.head_dim
        self.sign = torch.cat([-torch.ones(d // 2), torch.ones(d - d // 2)]).to(self.embed.weight)  # rotate_half's
        self.fast = None  # the runner's FastLinears, set once it is built over `fused`

    @property
    def fused(self) -> tuple[torch.nn.Linear, ...]:
        return tuple(m for layer in self.layers for m in (layer.qkv, layer.gate_up))

    @staticmethod
    def of(model: torch.nn.Module) -> "DecoderStep | None":
        """The step for `model`, or None where it keeps the Hugging Face forward (module doc)."""
        if os.environ.get(ENV, "1") == "0":
            return None
        cfg = model.config.get_text_config()
        if getattr(cfg, "model_type", None) not in FAMILIES or getattr(cfg, "hidden_act", None) != "silu":
            return None
        if getattr(cfg, "pretraining_tp", 1) != 1 or getattr(cfg, "attn_logit_softcapping", None):
            return None
        window = getattr(cfg, "sliding_window", None)
        if window and (getattr(cfg, "use_sliding_window", True) and window < (cfg.max_position_embeddings or 0)):
            return None
        inner = getattr(model, "model", None)
        needed = ("embed_tokens", "rotary_emb", "norm", "layers")
        if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
            return None
        if len({p.device for p in model.parameters()}) != 1:
            return None  # split over devices: the layers' own hooks move activations; the HF forward keeps them
        for layer in inner.layers:
            a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            projections = [getattr(a, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
            projections += [getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
            if not all(type(p) is torch.nn.Linear for p in projections) or not hasattr(a, "scaling"):
                return None
            if (a.q_proj.bias is None) != (a.v_proj.bias is None) or (m.gate_proj.bias is None) != (m.up_proj.bias is None):
                return None
        return DecoderStep(model)

    # ---- the step ----------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.half:  # HF: normalise in float32, round to the dtype, then scale in it
            return F.rms_norm(x.float(), weight.shape, None, self.eps).to(x.dtype) * weight
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _linear(self, x: torch.Tensor, mod: torch.nn.Linear, exact: bool, lone: bool) -> torch.Tensor:
        return self.fast.linear2d(x, mod, exact, lone)

    @torch.inference_mode()
    def forward(self, batch: StepBatch, pools: list[tuple[torch.Tensor, torch.Tensor]], attend, exact: bool
                ) -> torch.Tensor:
        """Logits [tokens, vocab] (float) of `batch`; every layer writes its tokens' K and V into its pool at
        `batch.dst` first. `attend(layer, q [tokens, heads, dim], keys, values, batch)` -> [tokens, heads, dim]
        reads them (the runner picks in place or gathered)."""
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        x = self.embed(batch.ids)  # [tokens, hidden]
        cos, sin = self.rotary(x, batch.positions[None])  # [1, tokens, dim] each, in x's dtype
        tokens, lone = x.shape[0], batch.lone
        # q and k heads rotate; v heads pass through (x * 1 + roll(x) * 0 is x, bit for bit)
        rotated = torch.arange(h + 2 * kvh, device=x.device)[None, :, None] < h + kvh  # [1, heads + 2 kv, 1]
        cos, sin = cos[0, :, None], (sin[0] * self.sign)[:, None]  # [tokens, 1, dim]
        cos_qkv, sin_qkv = torch.where(rotated, cos, 1), torch.where(rotated, sin, 0)  # [tokens, heads + 2 kv, dim]
        for i, (layer, (keys, values)) in enumerate(zip(self.layers, pools)):
            qkv = self._linear(self._rms(x, layer.ln1), layer.qkv, exact, lone).view(tokens, h + 2 * kvh, d)
            if layer.q_norm is None:
                q, k, v = (qkv * cos_qkv + qkv.roll(d // 2, -1) * sin_qkv).split((h, kvh, kvh), 1)
            else:
                q, k, v = qkv.split((h, kvh, kvh), 1)
                q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
                q = q * cos + q.roll(d // 2, -1) * sin
                k = k * cos + k.roll(d // 2, -1) * sin
            keys.index_copy_(0, batch.dst, k)
            values.index_copy_(0, batch.dst, v)
            out = attend(i, q, keys, values, batch)  # [tokens, heads, dim]
            x = x + self._linear(out.view(tokens, h * d), layer.o, exact, lone)
            gate, up = self._linear(self._rms(x, layer.ln2), layer.gate_up, exact, lone).chunk(2, -1)
            x = x + self._linear(F.silu(gate) * up, layer.down, exact, lone)
        return self._linear(self._rms(x, self.norm), self.lm_head, exact, lone).float()
