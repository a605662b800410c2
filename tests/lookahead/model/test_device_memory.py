"""The KV budget on an accelerator, against a stand-in for the device's memory: cached blocks and a closed
engine's pool count as free, a live one's as used, and two engines built one after the other in one process
both get the budget. The stand-in reports what torch would, from the tensors that really exist on the CPU."""

import gc

import pytest
import torch

from lookahead.config import LookaheadConfig
from lookahead.core.step_table import StepTable
from lookahead.engine.engine import Engine
from lookahead.engine.generate import LookaheadDecoder
from lookahead.engine.scheduler import SchedulerConfig
from lookahead.engine.sequence import StopCriteria
from lookahead.model import batch_cache
from lookahead.model.device_memory import Reading, budget_terms
from lookahead.model.kv_memory import kv_budget
from lookahead.model.runner import ModelRunner
from lookahead.model.static_step import StaticSteps

from tests.lookahead.tiny_models import tiny

MiB, GiB = 2**20, 2**30


def test_cached_blocks_and_spare_pools_are_free_and_the_rest_is_in_use():
    weights, spare = 26 * GiB, 10 * GiB
    # 3 GiB of CUDA context and another process; 8 GiB of a live tensor; 20 GiB cached by the allocator
    allocated = weights + spare + 8 * GiB
    reserved = allocated + 20 * GiB
    reading = Reading(total=140 * GiB, free=140 * GiB - reserved - 3 * GiB, reserved=reserved, allocated=allocated)
    terms = budget_terms(reading, weights, spare, activation_peak=2 * GiB)
    assert (terms.weights, terms.other, terms.activation_peak) == (26 * GiB, 11 * GiB, 2 * GiB)
    # the same device with no cached blocks gives the same terms: the allocator's cache is free memory
    uncached = Reading(140 * GiB, reading.free + 20 * GiB, allocated, allocated)
    assert budget_terms(uncached, weights, spare, 2 * GiB) == terms
    b = kv_budget(None, 0.9, terms, 0)
    assert b.bytes == int(140 * GiB * 0.9) - 26 * GiB - 11 * GiB - 2 * GiB
    assert "26.00 GiB weights" in b.source and "2.00 GiB activation peak" in b.source and "11.00 GiB other" in b.source
    assert b.terms() == {"source": b.source, "kv_budget_bytes": b.bytes, "device_bytes": 140 * GiB,
                         "utilization": 0.9, "weights_bytes": 26 * GiB, "activation_peak_bytes": 2 * GiB,
                         "other_bytes": 11 * GiB}


class StandInDevice:
    """An accelerator as torch would report it, over the CPU tensors that exist: allocated = the model's weights
    + every open pool + the spare pools + `held`; the allocator also caches `cached` bytes, and `outside` bytes
    are in use outside torch. A measured forward allocates `activation` bytes above what is allocated."""

    def __init__(self, runner: ModelRunner, total: int, cached: int, outside: int, activation: int) -> None:
        self.runner, self.total, self.cached, self.outside, self.activation = runner, total, cached, outside, activation
        self.held = 0
        self.probed: list[int] = []  # the context every probed verify row sat at
        self.before = batch_cache.live_pool_bytes(torch.device("cpu"))  # other tests' caches, not this device's

    def accelerated(self, device) -> bool:
        return True

    def read(self, device) -> Reading:
        allocated = (self.runner.weight_bytes(device) + batch_cache.live_pool_bytes(device) - self.before
                     + batch_cache.spare_bytes(device) + self.held)
        reserved = allocated + self.cached
        return Reading(self.total, self.total - reserved - self.outside, reserved, allocated)

    def peak_during(self, devices, fn) -> int:
        real = self.runner.verify_batch

        def watched(cache, trees, width, *a, **k):
            self.probed += list(cache.lengths)
            return real(cache, trees, width, *a, **k)

        self.runner.verify_batch = watched
        try:
            fn()
        finally:
            self.runner.verify_batch = real
        return self.activation


@pytest.fixture
def device():
    gc.collect()
    batch_cache._SPARE.clear()
    model = tiny("llama")
    runner = ModelRunner(model)
    dev = StandInDevice(runner, total=GiB, cached=300 * MiB, outside=64 * MiB, activation=32 * MiB)
    runner.memory = dev
    yield dev
    batch_cache._SPARE.clear()


def engine(dev: StandInDevice) -> Engine:
    dec = LookaheadDecoder(dev.runner, LookaheadConfig(decoding_length=8, branch_length=4), table=StepTable.flat())
    return Engine(dec, SchedulerConfig(max_batch_size=4, max_tokens_per_step=64, prefill_chunk=32))


def test_the_budget_is_the_device_share_less_weights_outside_memory_and_the_measured_peak(device):
    weights = device.runner.weight_bytes(torch.device("cpu"))
    with engine(device) as e:
        assert e.ledger.budget.bytes == int(0.9 * GiB) - weights - 64 * MiB - 32 * MiB  # the 300 MiB cached: free
        assert e.memory_stats().kv_budget_terms["activation_peak_bytes"] == 32 * MiB
        # the probe ran the largest verify (4 rows) with every row at the model's whole context, width 9
        assert device.probed == [256 - 9] * 4
        stop = StopCriteria(6)
        h = e.add_request([1, 2, 3, 4], stop=stop)
        while not h.done:
            e.step()
        assert len(h.result().tokens) == 6


def test_captured_decode_steps_hold_their_working_set_beside_the_prefills(device):
    # CUDA graphs keep the verify's activations in their pool for good: the budget leaves room for both peaks
    device.runner.static = StaticSteps(device.runner.step, device.runner._attention_modules(), torch.device("cpu"),
                                       capture=True)
    weights = device.runner.weight_bytes(torch.device("cpu"))
    with engine(device) as e:
        assert e.memory_stats().kv_budget_terms["activation_peak_bytes"] == 2 * 32 * MiB
        assert e.ledger.budget.bytes == int(0.9 * GiB) - weights - 64 * MiB - 2 * 32 * MiB
        assert device.probed == [256 - 9] * 4 and device.runner.static.captures == 0  # the probe ran eagerly


def test_two_engines_one_after_the_other_both_get_the_budget_and_share_one_pool(device):
    first = engine(device)
    budget, pool = first.ledger.budget.bytes, first.cache.layers[0].keys.data_ptr()
    first.close()
    assert first.cache.closed and batch_cache.spare_bytes(torch.device("cpu")) >= first.ledger.capacity_bytes
    with engine(device) as second:
        assert second.ledger.budget.bytes == budget  # the closed engine's pool is credited...
        assert second.cache.layers[0].keys.data_ptr() == pool  # ...and reused, not made again
        assert device.probed == [256 - 9] * 4  # the peak of that shape was measured once
        # a live engine's pool is in use: a third engine beside it gets what is left, or is refused
        try:
            left = device.runner.kv_budget(None, 0.9, 32 * MiB).bytes
        except ValueError as e:
            assert "no room for KV" in str(e)
        else:
            assert left == budget - second.ledger.pool_bytes < second.ledger.block_bytes


def test_what_else_holds_the_device_comes_out_of_the_budget(device):
    with engine(device) as e:
        budget = e.ledger.budget.bytes
    device.held = 200 * MiB  # another model's weights, say
    with engine(device) as e:
        assert e.ledger.budget.bytes == budget - 200 * MiB
        assert e.memory_stats().kv_budget_terms["other_bytes"] == 64 * MiB + 200 * MiB
    device.held = GiB
    with pytest.raises(ValueError, match="no room for KV: 1.00 GiB x gpu_memory_utilization 0.9"):
        engine(device)
