"""KV memory: per-token bytes from the real flagship configs, the budget's precedence, and admission by the ledger.

The Qwen-14B-Chat and ChatGLM3-6B `config.json` files (lookahead/model/flagships.py) are the checkpoints'
own shapes; they go through the same converters serving uses, and the weights are sized on the
meta device (nothing is allocated).
"""

from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from lookahead.config import LookaheadConfig
from lookahead.model import flagships
from lookahead.model.kv_memory import POOL_LAYER_ELEMENTS, SPARE_SLOTS, Budget, DeviceMemory, KVLedger, KVShape, kv_budget, staging_bytes
from lookahead.model.sampling import SamplingParams
from lookahead.engine.scheduler import Scheduler, SchedulerConfig
from lookahead.engine.sequence import Sequence, StopCriteria
from serve_app.config import AppConfig

CONFIGS = Path(__file__).parents[3] / "configs"
GiB = 2**30
NAMES = {"qwen-14b-chat": "Qwen-14B", "chatglm3-6b": "ChatGLM3-6B"}


def native(name: str):
    return flagships.native(NAMES[name])


def weight_bytes(config, dtype=torch.bfloat16) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_token_bytes_of_the_flagships():
    # 40 layers x (K and V) x 40 heads x 128 x 2 bytes; 28 layers x 2 x 2 groups x 128 x 2 bytes
    assert KVShape.of(native("qwen-14b-chat"), 2).token_bytes == 819_200
    assert KVShape.of(native("chatglm3-6b"), 2).token_bytes == 28_672


def test_the_budget_follows_its_precedence():
    gpu = DeviceMemory(total=80 * GiB, weights=28 * GiB, other=2 * GiB, activation_peak=2 * GiB)
    assert kv_budget(1.5, 0.9, gpu, 64 * GiB).bytes == int(1.5 * GiB)  # kv_cache_gb wins on any device
    assert kv_budget(None, 0.9, gpu, 64 * GiB).bytes == int(80 * GiB * 0.9) - 32 * GiB
    assert kv_budget(None, 0.9, None, 64 * GiB).bytes == 16 * GiB  # CPU: a quarter of the available RAM
    with pytest.raises(ValueError, match="no room for KV"):
        kv_budget(None, 0.3, gpu, 64 * GiB)


def seq(prompt_tokens: int, new_tokens: int) -> Sequence:
    return Sequence([1] * prompt_tokens, StopCriteria(new_tokens), SamplingParams(), LookaheadConfig())


def admit_all(s: Scheduler) -> int:
    """Prefill and admit whatever the scheduler lets start, as the engine would."""
    while (chunk := s.next_prefill_chunk()) is not None:
        chunk[0].done = chunk[0].total
        assert s.can_admit()
        s.admit()
    return len(s.running)


@pytest.mark.parametrize("gib", [80, 141])
@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_plan_admits_what_fits_and_never_more(name, gib):
    config = native(name)
    shape = KVShape.of(config, 2)
    weights = weight_bytes(config)
    device = DeviceMemory(total=gib * GiB, weights=weights, other=GiB // 2, activation_peak=GiB)  # CUDA context
    ledger = KVLedger(shape, kv_budget(None, 0.9, device, 0))
    headroom = LookaheadConfig().decoding_length + 1
    worst = 6144 + 2048 + headroom
    block_bytes = ledger.block_tokens * shape.token_bytes
    expected = ledger.budget.bytes // block_bytes // -(-worst // ledger.block_tokens)
    assert expected == ledger.admissible(worst) >= 1
    s = Scheduler(SchedulerConfig(max_batch_size=4096, max_tokens_per_step=4096), ledger=ledger, headroom=headroom)
    for _ in range(expected + 5):
        s.add(seq(6144, 2048))
    assert admit_all(s) == expected and len(s.waiting) == 5
    assert ledger.reserved_bytes <= ledger.budget.bytes
    s.remove_row(0)  # one finishes: exactly one more starts
    assert admit_all(s) == expected and len(s.waiting) == 4


@pytest.mark.parametrize("name,config_file,gib,worst_cases", [
    ("qwen-14b-chat", "qwen14b.yaml", 80, 6), ("qwen-14b-chat", "qwen14b.yaml", 139.8, 14),
    ("chatglm3-6b", "chatglm3-6b.yaml", 80, 35)])
def test_the_gpu_configs_fit_as_their_comments_say(name, config_file, gib, worst_cases):
    """configs/*.yaml's memory settings on the card, with the checkpoint's weights sized on the meta device, a
    CUDA context of 0.5 GiB and an activation peak of the read staging (every row at the whole context, one
    layer) + 1 GiB (exact attention's float64 working set, attention.EXACT_CALL_BYTES; logits): the worst-case
    requests their comments state fit at once, the prefix cache fits inside the budget, and everything together
    stays within the device's share."""
    args = yaml.safe_load((CONFIGS / config_file).read_text())["applications"][0]["args"]
    cfg = AppConfig.model_validate(args).models[0]
    config = native(name)
    shape = KVShape.of(config, 2)
    weights = weight_bytes(config)
    staging = staging_bytes(shape, cfg.batching.max_batch_size, config.max_position_embeddings)
    device = DeviceMemory(gib * GiB, weights, GiB // 2, GiB + staging)
    budget = kv_budget(cfg.memory.kv_cache_gb, cfg.memory.gpu_memory_utilization, device, 0)
    ledger = KVLedger(shape, budget)
    worst = cfg.limits.max_prompt_tokens + cfg.limits.max_new_tokens + cfg.lookahead.decoding_length_bound + 1
    assert ledger.admissible(worst) == worst_cases
    assert cfg.batching.prefix_cache_mb * 2**20 < budget.bytes
    assert weights + GiB // 2 + GiB + staging + budget.bytes <= gib * GiB * cfg.memory.gpu_memory_utilization


def test_a_request_waits_for_memory_and_the_queue_stays_fifo():
    shape = KVShape(layers=2, kv_heads=1, head_dim=4, dtype_bytes=4)  # 64 bytes per token
    ledger = KVLedger(shape, Budget(64 * (16 * 10 + SPARE_SLOTS), "test"), block_tokens=16)  # 10 blocks
    s = Scheduler(SchedulerConfig(max_batch_size=8, max_tokens_per_step=64), ledger=ledger, headroom=4)
    big, small = seq(100, 50), seq(4, 4)  # 154 tokens: 10 blocks; 12 tokens: 1 block
    first = seq(4, 4)
    for q in (first, big, small):
        s.add(q)
    assert admit_all(s) == 1  # `first` runs; `big` cannot start, and `small` does not jump it
    assert list(s.waiting) == [big, small]
    s.remove_row(0)
    assert admit_all(s) == 1 and s.running == [big]
    assert not ledger.can_reserve(1)
    assert ledger.fits_ever(160) and not ledger.fits_ever(161)


def test_held_tokens_report_whole_blocks_and_the_peak():
    ledger = KVLedger(KVShape(1, 1, 1, 4), Budget(8 * 16 * 4, "test"), block_tokens=16)
    ledger.reserve(1, 40)  # 3 blocks
    ledger.hold(1, 17)
    assert ledger.used_bytes == 2 * 16 * 8
    ledger.hold(1, 40)
    with pytest.raises(AssertionError):
        ledger.hold(1, 49)
    ledger.release(1)
    assert ledger.used_bytes == 0 and ledger.peak_bytes == 3 * 16 * 8


def test_reservations_are_contiguous_and_coalesce_when_released():
    ledger = KVLedger(KVShape(1, 1, 1, 4), Budget((10 * 16 + SPARE_SLOTS) * 8, "test"), block_tokens=16)  # 10 blocks
    assert [ledger.reserve(k, n * 16) for k, n in (("a", 3), ("b", 3), ("c", 4))] == [0, 48, 96]
    ledger.release("a")
    ledger.release("c")
    assert ledger.free_blocks == 7 and not ledger.can_reserve(5 * 16)  # 3 + 4 free, but not in one run
    assert ledger.reserve("d", 4 * 16) == 96  # first fit: the run that holds it
    ledger.release("b")
    ledger.release("d")
    assert ledger.reserve("e", 10 * 16) == 0  # everything left: one run again


def test_qwen14b_on_an_h200_holds_over_100k_tokens_and_15_of_the_gpu_checks_requests():
    """The GPU check's section E on an H200 as torch reports it (139.8 GiB): Qwen-14B's weights from its
    config.json, a 0.5 GiB CUDA context, and the activation peak of 32 rows at the whole 8k context (the read
    staging) + 1 GiB. vLLM's figure for this model on this card is ~120k tokens."""
    config = native("qwen-14b-chat")
    shape = KVShape.of(config, 2)
    peak = staging_bytes(shape, 32, config.max_position_embeddings) + GiB
    ledger = KVLedger(shape, kv_budget(None, 0.9, DeviceMemory(int(139.8 * GiB), weight_bytes(config), GiB // 2,
                                                              peak), 0))
    assert 100_000 <= ledger.token_capacity <= 125_000
    worst = 6144 + 8 + LookaheadConfig().decoding_length + 1  # section E's requests: 6,144 prompt, 8 new
    assert ledger.admissible(worst) >= 15


def test_the_pool_stays_within_the_kernels_32_bit_offsets():
    """One layer's keys stay below 2^31 elements whatever the budget: a 1-layer model of 8 x 128 a token given
    64 GiB would hold 2^21 tokens and reach it; no flagship gets near it on a 141 GiB card."""
    small = KVShape(layers=1, kv_heads=8, head_dim=128, dtype_bytes=2)
    led = KVLedger(small, Budget(64 * GiB, "test"))
    assert led.budget_blocks * led.block_tokens + SPARE_SLOTS > POOL_LAYER_ELEMENTS // (8 * 128)  # over the bound
    slots = led.token_capacity + SPARE_SLOTS
    assert slots * 8 * 128 < POOL_LAYER_ELEMENTS and (slots + led.block_tokens) * 8 * 128 >= POOL_LAYER_ELEMENTS
    assert led.pool_bytes == slots * small.token_bytes
    for name in NAMES:
        whole_card = KVLedger(KVShape.of(native(name), 2), Budget(int(139.8 * GiB), "h200"))
        assert whole_card.bound_blocks > whole_card.budget_blocks, name
