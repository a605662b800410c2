"""The exact fp32 tree attention kernel (tree_attention.py) under Triton's interpreter on the CPU: a draft in a tree
gets the bits that token gets decoded plainly (its ancestors committed at consecutive positions), a row gets the
same bits alone and beside other rows at a wider bucket, and the result is attention (within bf16 rounding of
the float64 reference). The interpreter runs the kernel's own algorithm; the GPU's rounding and speed are the
GPU check's (section P)."""

import pytest
import torch

from lookahead.core.draft import DraftTree
from lookahead.core.step_table import StepTable
from lookahead.model import attention, tree_attention
from lookahead.model.runner import ModelRunner
from lookahead.model.tree_mask import ancestor_matrix
from tests.lookahead.model.test_exact import lookahead_and_plain
from tests.lookahead.tiny_models import tiny

HEADS, KV_HEADS, DIM = 4, 2, 16
PARENTS = [-1, 0, 0, 1, 3, 2, 4]  # a tree of 7: two branches, the left one 4 deep


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tree_attention.usable(torch.device("cpu"))


def depths_of(parents):
    out = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def run(q, pool_k, pool_v, rows, chunk=None, max_walk=None):
    """rows: (offset, length, width, parents) each; q [rows * W, heads, dim] for W the widest width; `chunk`
    the kernel's split (default: the module's), `max_walk` the launch's bound (default: the longest walk)."""
    W = max(r[2] for r in rows)
    R = len(rows)
    anc = torch.zeros(R, W, W, dtype=torch.bool)
    depths = torch.full((R, W), -1, dtype=torch.long)  # padding tokens attend no tree position
    for b, (_, _, width, parents) in enumerate(rows):
        anc[b] = torch.eye(W, dtype=torch.bool)
        anc[b, :width, :width] = torch.from_numpy(ancestor_matrix(parents))
        depths[b, :width] = torch.tensor(depths_of(parents))
    paths = tree_attention.ancestor_paths(anc, depths)
    offsets = torch.tensor([r[0] for r in rows])
    lengths = torch.tensor([r[1] for r in rows])
    walk = lengths + torch.tensor([r[2] for r in rows])
    return tree_attention.attend(q, pool_k, pool_v, offsets, lengths, depths.flatten(), paths.flatten(0, 1),
                                 walk, R, W, DIM ** -0.5, max_walk or int(walk.max()), chunk)


def pool(slots, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(slots, KV_HEADS, DIM, generator=g).bfloat16(),
            torch.randn(slots, KV_HEADS, DIM, generator=g).bfloat16())


CHUNKS = [16, 32, tree_attention.CHUNK]  # one block a chunk; a chunk edge inside the tree (L = 37); unsplit


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("L", [37, 44])  # 44: the tree crosses the edge at 48, which its shallow drafts do not reach
def test_a_draft_gets_the_bits_of_the_same_token_decoded_plainly(chunk, L):
    off = 5
    k, v = pool(200, 0)
    q = torch.randn(len(PARENTS), HEADS, DIM, generator=torch.Generator().manual_seed(1)).bfloat16()
    tree = run(q, k, v, [(off, L, len(PARENTS), PARENTS)], chunk)
    depths = depths_of(PARENTS)
    for w, d in enumerate(depths):
        path = [w]
        while PARENTS[path[-1]] >= 0:
            path.append(PARENTS[path[-1]])
        path.reverse()  # root .. w, by depth
        pk, pv = k.clone(), v.clone()  # plainly: the ancestors committed one after another after the context
        pk[off + L : off + L + d + 1] = k[[off + L + a for a in path]]
        pv[off + L : off + L + d + 1] = v[[off + L + a for a in path]]
        plain = run(q[w : w + 1], pk, pv, [(off, L + d, 1, [-1])], chunk)
        assert torch.equal(tree[w], plain[0]), f"token {w} at depth {d}"


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_row_gets_the_same_bits_alone_and_beside_others_at_a_wider_bucket(chunk):
    k, v = pool(400, 2)
    mine = (100, 61, len(PARENTS), PARENTS)
    q_alone = torch.randn(len(PARENTS), HEADS, DIM, generator=torch.Generator().manual_seed(3)).bfloat16()
    alone = run(q_alone, k, v, [mine], chunk)
    W = 16  # the bucket: every row padded to 16 tokens
    rows = [(0, 90, 3, [-1, 0, 1]), mine, (200, 7, 1, [-1]), (250, 130, 16, [-1] + list(range(15)))]
    q = torch.randn(len(rows) * W, HEADS, DIM, generator=torch.Generator().manual_seed(4)).bfloat16()
    q[W : W + len(PARENTS)] = q_alone
    batch = run(q, k, v, rows, chunk, max_walk=512)  # a bucket's bound past every walk: chunks no row reaches
    assert torch.equal(batch[W : W + len(PARENTS)], alone)


def test_chunks_a_query_does_not_reach_fold_as_exact_no_ops():
    """The same call split into chunks that end past every query (a larger bound), or left in one chunk, gives
    the same bits: the fold of the chunks' states is the single chunk's output when only one is reached."""
    k, v = pool(300, 7)
    rows = [(3, 20, len(PARENTS), PARENTS), (100, 9, 3, [-1, 0, 0])]
    q = torch.randn(2 * len(PARENTS), HEADS, DIM, generator=torch.Generator().manual_seed(8))  # fp32 out: every bit
    one = run(q, k, v, rows, chunk=32)  # both walks fit one chunk: the first kernel writes the output
    split = run(q, k, v, rows, chunk=32, max_walk=200)  # seven chunks, six of them reached by no query
    assert torch.equal(one, split)
    assert not torch.equal(run(q, k, v, rows, chunk=16), one)  # (a chunk edge inside the walk moves bits)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_it_is_attention_within_bf16_rounding_of_the_float64_reference(chunk):
    off, L = 9, 50
    k, v = pool(120, 5)
    q = torch.randn(len(PARENTS), HEADS, DIM, generator=torch.Generator().manual_seed(6)).bfloat16()
    got = run(q, k, v, [(off, L, len(PARENTS), PARENTS)], chunk)
    n = L + len(PARENTS)
    mask = torch.ones(len(PARENTS), n, dtype=torch.bool)
    mask[:, L:] = torch.from_numpy(ancestor_matrix(PARENTS))
    keys = k[off : off + n].transpose(0, 1)[None]  # [1, kv_heads, n, dim]
    values = v[off : off + n].transpose(0, 1)[None]
    ref, _ = attention.exact_sdpa(None, q.transpose(0, 1)[None], keys, values, mask[None, None], scaling=DIM ** -0.5)
    torch.testing.assert_close(got, ref[0], rtol=0, atol=2 ** -7)  # about one bf16 unit at these magnitudes


@pytest.mark.parametrize("family,chunk", [("llama", None), ("qwen3", None), ("qwen2", 32)])
def test_bf16_lookahead_through_the_kernel_decodes_exactly_what_plain_decoding_does(family, chunk, monkeypatch):
    """The static step with the kernel as its attention (LOOKAHEAD_TREE_ATTENTION=triton), four requests at
    once, fixed budgets so every tree is verified: the tokens equal the same engine's plain decoding; with
    chunks of two blocks too, so steps split their walks into several chunks."""
    monkeypatch.setenv(tree_attention.ENV, "triton")
    if chunk:
        monkeypatch.setattr(tree_attention, "CHUNK", chunk)
    runner = ModelRunner(tiny(family).to(torch.bfloat16), static_step=True)
    assert runner.static.tree_attention
    drafted, plain = lookahead_and_plain(runner, 30, StepTable.flat())
    assert [g.tokens for g in drafted] == [g.tokens for g in plain]
    assert sum(g.stats.accepted_drafts for g in drafted) > 0


def test_without_the_switch_the_static_step_keeps_float64_attention():
    assert not ModelRunner(tiny("qwen2").to(torch.bfloat16), static_step=True).static.tree_attention


def test_the_kernel_and_the_float64_static_step_keep_their_own_buckets_over_one_cache():
    from lookahead.model.static_step import StaticSteps

    runner = ModelRunner(tiny("qwen2").to(torch.bfloat16), static_step=True)
    fused = StaticSteps(runner.step, runner._attention_modules(), runner.device, fused=True)
    cache = runner.new_batch_cache(1, 64)
    single = runner.new_cache(64)
    runner.prefill(single, [3, 1, 4, 1, 5])
    cache.admit(single, 16)
    tree = DraftTree([9, 2, 6], [-1, 0, 0], [0, 1, 1], [1.0] * 3)
    outs = []
    for static in (runner.static, fused, runner.static):
        runner.static = static
        outs.append(runner.verify_batch(cache, [tree], 3)[0][:3].clone())
    assert len(cache.captured["static"]) == 2  # one bucket, one record per attention
    assert torch.equal(outs[0], outs[2]) and outs[0].argmax(-1).tolist() == outs[1].argmax(-1).tolist()
