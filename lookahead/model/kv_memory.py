"""KV memory: what one token costs, how much the replica may spend, and the ledger that admits by it.

A request is admitted only when its worst case fits: prompt + max_tokens +
the tree headroom a verification writes past the committed context, rounded
up to whole blocks of `block_tokens`. The ledger reserves that many
contiguous blocks for the request's life, so an admitted request can always
finish: no preemption, no out-of-memory mid-generation. The blocks are
places in the engine's KV pool (`batch_cache.py`): a reservation is where
the request's keys and values live. The prefix cache reserves its entries
here too, so it is inside the same budget. Reservations are first-fit; a release coalesces
with its free neighbours, so once the running requests leave, any request
that fits the budget at all fits again. What a row actually holds (`hold`)
grows inside its reservation; `used_bytes` and `peak_bytes` report that.

The budget, in order of precedence:
- `memory.kv_cache_gb`, when set, on any device;
- on CUDA, per device: its memory x `gpu_memory_utilization`, less this
  model's weights, less what else is in use there (other tensors torch
  holds, and memory outside torch: the CUDA context, other processes), less
  the activation peak of the engine's largest forward, measured at start
  (vLLM's rule). PyTorch's cached but unallocated blocks, and a closed
  engine's pool kept for the next one, count as free;
- on CPU, `HOST_SHARE` of the RAM available at start.

Whatever the budget, one layer's keys (or values) hold fewer than `POOL_LAYER_ELEMENTS`: the tree attention
kernel indexes the pool with 32-bit offsets. No flagship reaches it on one GPU (Qwen-14B, the widest a token,
would need 419k tokens, 320 GiB of KV); a few-layer model given a large budget would, and gets fewer blocks.

Pure Python; no torch.
"""

import os
from dataclasses import dataclass, field
from math import ceil


@dataclass(frozen=True)
class KVShape:
    """The per-token KV footprint of a model: keys and values of every layer."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int  # 4 for fp32, 2 for bf16 / fp16

    @property
    def token_bytes(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_token_bytes(self) -> int:
        """One layer's keys and values of one token: what the batch's read staging holds per row position."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @classmethod
    def of(cls, config, dtype_bytes: int) -> "KVShape":
        """From a transformers config (Llama, Mistral, Qwen2/3, Glm: the architectures the runner serves)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, dtype_bytes)


@dataclass(frozen=True)
class DeviceMemory:
    """An accelerator's memory as the budget sees it, in bytes (`device_memory.budget_terms` reads it)."""

    total: int
    weights: int  # this model's parameters and buffers on the device
    other: int  # in use and not the pool's to take: other tensors torch holds, and memory outside torch
    activation_peak: int  # the most one forward of the engine's allocates above what is allocated before it


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # which rule gave it, for the start-up log and /stats
    device: DeviceMemory | None = None  # the terms, where the device's memory set it
    utilization: float | None = None

    def __post_init__(self) -> None:
        if self.bytes < 0:
            raise ValueError(f"negative KV budget from {self.source}")

    def terms(self) -> dict:
        """The terms behind the number, for /stats: the operator sees why the budget is what it is."""
        out = {"source": self.source, "kv_budget_bytes": self.bytes}
        if self.device is not None:
            d = self.device
            out.update(device_bytes=d.total, utilization=self.utilization, weights_bytes=d.weights,
                       activation_peak_bytes=d.activation_peak, other_bytes=d.other)
        return out


def staging_bytes(shape: KVShape, rows: int, context: int) -> int:
    """The most the batch cache's read staging can take: one layer's keys and values for `rows` rows of a
    whole `context` (batch_cache.py gathers a multi-row batch's ranges there, one layer at a time)."""
    return rows * context * shape.layer_token_bytes


def host_available_bytes() -> int:
    """RAM available to new allocations now (Linux `MemAvailable`; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


HOST_SHARE = 0.25  # of the RAM available at start, when nothing else says: the rest is weights, activations, Ray


def kv_budget(kv_cache_gb: float | None, utilization: float, device: DeviceMemory | None,
              host_available: int) -> Budget:
    if kv_cache_gb is not None:
        return Budget(int(kv_cache_gb * 2**30), f"memory.kv_cache_gb={kv_cache_gb:g}")
    if device is not None:
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        terms = (f"{gib(device.total)} x gpu_memory_utilization {utilization:g} - {gib(device.weights)} weights - "
                 f"{gib(device.activation_peak)} activation peak - {gib(device.other)} other")
        free = int(device.total * utilization) - device.weights - device.other - device.activation_peak
        if free <= 0:
            raise ValueError(f"no room for KV: {terms} leaves nothing")
        return Budget(free, terms, device, utilization)
    return Budget(int(host_available * HOST_SHARE), f"{HOST_SHARE:g} of {host_available / 2**30:.1f} GiB available RAM")


SPARE_SLOTS = 1  # pool slots past the ledger's blocks: the trash slot padded static steps write (static_step.py)
POOL_LAYER_ELEMENTS = 2**31  # one layer's keys stay below: tree_attention's kernel offsets are 32-bit


@dataclass
class KVLedger:
    """Blocks of the budget reserved per request; admission asks it first."""

    shape: KVShape
    budget: Budget
    block_tokens: int = 16
    _reserved: dict[object, tuple[int, int]] = field(default_factory=dict)  # request key -> (first block, blocks)
    _free: list[tuple[int, int]] = field(default_factory=list)  # free runs (first block, blocks), in block order
    _held: dict[object, int] = field(default_factory=dict)  # request key -> tokens its row holds now
    _used_blocks: int = 0  # whole blocks the holders hold now, summed
    peak_bytes: int = 0  # the most held at once

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self._free = [(0, self.blocks)] if self.blocks else []

    @classmethod
    def for_rows(cls, shape: KVShape, rows: int, row_tokens: int, block_tokens: int = 16) -> "KVLedger":
        """A ledger with room for exactly `rows` reservations of `row_tokens` each."""
        blocks = rows * ceil(row_tokens / block_tokens)
        return cls(shape, Budget((blocks * block_tokens + SPARE_SLOTS) * shape.token_bytes,
                                 f"{rows} rows of {row_tokens} tokens"), block_tokens)

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.shape.token_bytes

    @property
    def blocks(self) -> int:
        return min(self.budget_blocks, self.bound_blocks)

    @property
    def budget_blocks(self) -> int:
        """The blocks the budget pays for, after the pool's slot that no row owns."""
        return max(0, self.budget.bytes - SPARE_SLOTS * self.shape.token_bytes) // self.block_bytes

    @property
    def bound_blocks(self) -> int:
        """The most blocks a pool may have: one layer's keys below POOL_LAYER_ELEMENTS, the spare slot included."""
        slots = (POOL_LAYER_ELEMENTS - 1) // (self.shape.kv_heads * self.shape.head_dim)
        return max(0, slots - SPARE_SLOTS) // self.block_tokens

    @property
    def capacity_bytes(self) -> int:
        """What the rows can hold: the budget's whole blocks, after the pool's slot that no row owns."""
        return self.blocks * self.block_bytes

    @property
    def pool_bytes(self) -> int:
        """What the pool holds: the rows' blocks and the slot no row owns (batch_cache: the trash slot)."""
        return self.capacity_bytes + SPARE_SLOTS * self.shape.token_bytes

    @property
    def token_capacity(self) -> int:
        return self.blocks * self.block_tokens

    def blocks_for(self, tokens: int) -> int:
        return ceil(tokens / self.block_tokens)

    def fits_ever(self, tokens: int) -> bool:
        """Could a request of this worst case run at all, alone?"""
        return self.blocks_for(tokens) <= self.blocks

    @property
    def free_blocks(self) -> int:
        return sum(n for _, n in self._free)

    def _fit(self, need: int) -> int | None:
        return next((i for i, (_, n) in enumerate(self._free) if n >= need), None)

    def can_reserve(self, tokens: int) -> bool:
        return self._fit(self.blocks_for(tokens)) is not None

    def reserve(self, key: object, tokens: int) -> int:
        """Reserve a contiguous range for `tokens` entries; return its first token's place in the pool."""
        assert key not in self._reserved, "one reservation per request"
        need = self.blocks_for(tokens)
        i = self._fit(need)
        if i is None:
            raise MemoryError(f"{need} contiguous KV blocks asked; {self.free_blocks} free in {len(self._free)} runs")
        start, n = self._free[i]
        if n == need:
            del self._free[i]
        else:
            self._free[i] = (start + need, n - need)
        self._reserved[key] = (start, need)
        self._held[key] = 0
        return start * self.block_tokens

    def offset(self, key: object) -> int:
        return self._reserved[key][0] * self.block_tokens

    def reserved_tokens(self, key: object) -> int:
        return self._reserved[key][1] * self.block_tokens

    def hold(self, key: object, tokens: int) -> None:
        """The request's row now holds `tokens` entries (its committed context plus this step's tree)."""
        assert self.blocks_for(tokens) <= self._reserved[key][1], "a row outgrew its reservation"
        self._used_blocks += self.blocks_for(tokens) - self.blocks_for(self._held.get(key, 0))
        self._held[key] = tokens
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def release(self, key: object) -> None:
        self._used_blocks -= self.blocks_for(self._held.pop(key, 0))
        got = self._reserved.pop(key, None)
        if got is None:
            return
        runs = sorted([*self._free, got])
        merged = [runs[0]]
        for start, n in runs[1:]:
            last_start, last_n = merged[-1]
            if last_start + last_n == start:
                merged[-1] = (last_start, last_n + n)
            else:
                merged.append((start, n))
        self._free = merged

    @property
    def reserved_bytes(self) -> int:
        return sum(n for _, n in self._reserved.values()) * self.block_bytes

    @property
    def used_bytes(self) -> int:
        """Whole blocks the running rows (and the prefix cache's entries) hold now."""
        return self._used_blocks * self.block_bytes

    def admissible(self, tokens: int) -> int:
        """How many requests of this worst case fit the whole budget at once."""
        return self.blocks // self.blocks_for(tokens)
