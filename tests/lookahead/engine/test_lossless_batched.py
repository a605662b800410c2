"""Greedy lookahead under batching == model.generate, token for token, for every family's tiny model.

test_lossless_architectures.py checks each family single-stream; here the same families run four at a
time through the Engine, where rows of different lengths share one padded tree-verify forward.
"""

import pytest

from lookahead import LookaheadConfig, LookaheadDecoder, StopCriteria
from lookahead.engine.engine import Engine
from lookahead.core.step_table import StepTable
from lookahead.model.runner import ModelRunner
from lookahead.engine.scheduler import SchedulerConfig

from tests.lookahead.engine.test_engine import PROMPTS, drain
from tests.lookahead.engine.test_lossless_architectures import hf_greedy
from tests.lookahead.tiny_models import FAMILIES, tiny


def assert_batched_lossless(model, new_tokens: int = 32) -> None:
    runner = ModelRunner(model)
    runner.check_tree_masks()
    la = LookaheadConfig(decoding_length=16, branch_length=6, adaptive=False)
    dec = LookaheadDecoder(runner, la, table=StepTable.flat())
    engine = Engine(dec, SchedulerConfig(max_batch_size=4, max_tokens_per_step=64))
    refs = [hf_greedy(model, p, new_tokens) for p in PROMPTS]
    # Half the references primed into the trie: those rows accept long drafts, the others mostly step by
    # one, so the batch's rows advance unevenly (5 prompts, 4 rows: one request also joins mid-stream).
    for r in refs[::2]:
        dec.memory.add_sequence(r)
    results = drain(engine, [engine.add_request(p, stop=StopCriteria(new_tokens)) for p in PROMPTS])
    assert [r.tokens for r in results] == refs
    assert sum(r.stats.accepted_drafts for r in results) > 0, "no draft accepted: the tree path went untested"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_batched_greedy_identical_to_generate(family):
    assert_batched_lossless(tiny(family))
