"""The paged attention kernel: rows at any offsets of a NaN-filled pool attend as each row alone would, in every
dtype and head layout the pool holds; a query gets the same bits alone as in a tree or a batch (exact attention);
views read like the pool; and a kernel that cannot be built leaves the gather."""

import math

import pytest
import torch

from lookahead.model import attention, native, paged_attention
from lookahead.model.paged_attention import PoolRead

TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rows_case(heads, kv_heads, dim, dtype, counts, lengths, padded=False, seed=0):
    """A NaN-filled pool with each row's entries (committed + this forward's) at its own offset, holes between;
    queries packed row after row (padded: every row `width` tokens); a tree-like mask per row."""
    g = torch.Generator().manual_seed(seed)
    rows, width = len(counts), max(counts)
    kv_lens = [l + (width if padded else c) for l, c in zip(lengths, counts)]
    offsets, at = [], 5
    for n in kv_lens:
        offsets.append(at)
        at += n + 3 + int(torch.randint(0, 9, (1,), generator=g))  # gaps of garbage between rows
    pool_k = torch.full((at + 4, kv_heads, dim), float("nan"), dtype=dtype)
    pool_v = pool_k.clone()
    for off, n in zip(offsets, kv_lens):
        pool_k[off : off + n] = torch.randn(n, kv_heads, dim, generator=g).to(dtype)
        pool_v[off : off + n] = torch.randn(n, kv_heads, dim, generator=g).to(dtype)
    sent = [width] * rows if padded else counts
    q = torch.randn(sum(sent), heads, dim, generator=g).to(dtype) * 2
    kv_len = max(kv_lens)
    mask = torch.zeros(rows, 1, width, kv_len, dtype=torch.bool)
    for b, (l, s) in enumerate(zip(lengths, sent)):
        mask[b, 0, :s, :l] = True  # the committed context
        tree = torch.rand(s, s, generator=g) < 0.5
        mask[b, 0, :s, l : l + s] = tree.tril(-1) | torch.eye(s, dtype=torch.bool)  # ancestors and itself
    starts = [sum(sent[:b]) for b in range(rows)]
    read = PoolRead(*(torch.tensor(x) for x in (offsets, kv_lens, starts, sent)))
    read.bases = read.bases * kv_heads * dim  # slots -> elements
    return q, pool_k, pool_v, read, mask


def reference(q, pool_k, pool_v, read, mask):
    """float64, each row alone: its own keys only, under its own mask rows."""
    out = torch.empty(q.shape, dtype=torch.float64)
    groups = q.shape[1] // pool_k.shape[1]
    token = pool_k.shape[1] * pool_k.shape[2]
    for b in range(len(read.bases)):
        off, n, s, c = (int(x[b]) for x in (read.bases // token, read.kv_lens, read.starts, read.counts))
        k = pool_k[off : off + n].double().repeat_interleave(groups, 1).transpose(0, 1)  # [heads, n, dim]
        v = pool_v[off : off + n].double().repeat_interleave(groups, 1).transpose(0, 1)
        scores = q[s : s + c].double().transpose(0, 1) @ k.transpose(1, 2) / math.sqrt(q.shape[2])  # [heads, c, n]
        scores = scores.masked_fill(~mask[b, 0, :c, :n], float("-inf"))
        out[s : s + c] = (scores.softmax(-1) @ v).transpose(0, 1)
    return out


@pytest.fixture(scope="module")
def kernel():
    k = paged_attention.kernel()
    assert k is not None, "this machine has a C++ compiler (scripts/setup.sh needs one): the kernel must build"
    return k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads,kv_heads,dim", [(6, 2, 64), (4, 4, 32), (8, 1, 128), (2, 2, 8), (12, 4, 24)])
@pytest.mark.parametrize("padded", [False, True], ids=["ragged", "padded"])
def test_rows_anywhere_in_a_nan_pool_attend_as_if_alone(kernel, dtype, heads, kv_heads, dim, padded):
    counts, lengths = [1, 7, 3, 1, 1, 40, 2], [0, 33, 5, 70, 1, 300, 129]  # a 1-token first row; 40 past a block
    q, k, v, read, mask = rows_case(heads, kv_heads, dim, dtype, counts, lengths, padded)
    got = kernel.attend(q, k, v, read, mask, dim ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape and torch.isfinite(got).all()
    want = reference(q, k, v, read, mask)
    torch.testing.assert_close(got.double(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_query_gets_the_same_bits_alone_as_in_a_tree(kernel, dtype):
    """Exact attention's promise: a draft verified in a tree (siblings' keys interleaved, masked) gets the bits it
    gets later as a plain step over its context and accepted ancestors, contiguous."""
    g = torch.Generator().manual_seed(7)
    kv_heads, heads, dim, context = 2, 6, 64, 45
    parents = [-1, 0, 0, 1, 2, 1, 3, 5, 4]  # a branching tree of 9 tokens
    width = len(parents)
    keys = torch.randn(context + width, kv_heads, dim, generator=g).to(dtype)
    values = torch.randn(context + width, kv_heads, dim, generator=g).to(dtype)
    q = torch.randn(width, heads, dim, generator=g).to(dtype)
    mask = torch.zeros(1, 1, width, context + width, dtype=torch.bool)
    mask[..., :context] = True
    path = []
    for i, p in enumerate(parents):
        path.append((path[p] if p >= 0 else []) + [i])
        mask[0, 0, i, [context + a for a in path[i]]] = True
    read = PoolRead(torch.tensor([0]), torch.tensor([context + width]), torch.tensor([0]), torch.tensor([width]))
    tree = kernel.attend(q, keys, values, read, mask, dim ** -0.5)
    for i in range(width):
        seen = list(range(context)) + [context + a for a in path[i]]
        one = PoolRead(torch.tensor([0]), torch.tensor([len(seen)]), torch.tensor([0]), torch.tensor([1]))
        alone = kernel.attend(q[i : i + 1], keys[seen], values[seen], one, torch.ones(1, 1, 1, len(seen), dtype=torch.bool),
                              dim ** -0.5)
        assert torch.equal(alone[0], tree[i]), f"tree token {i}"


def test_a_rows_output_does_not_depend_on_what_shares_the_call(kernel):
    """Few rows split their heads over the threads, many do not: either way a row's bits are the same."""
    counts, lengths = [4, 1, 2, 6, 1, 1, 3, 2, 5], [50, 9, 130, 33, 2, 77, 64, 1, 250]
    q, k, v, read, mask = rows_case(9, 3, 64, torch.float32, counts, lengths, seed=5)
    together = kernel.attend(q, k, v, read, mask, 0.125)
    for b in (0, 3, 8):
        s, c = int(read.starts[b]), int(read.counts[b])
        one = PoolRead(read.bases[b : b + 1], read.kv_lens[b : b + 1], torch.tensor([0]), read.counts[b : b + 1])
        alone = kernel.attend(q[s : s + c], k, v, one, mask[b : b + 1], 0.125)
        assert torch.equal(alone, together[s : s + c])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_head_major_view_reads_like_the_pool(kernel, dtype):
    """A KVCache's [rows, kv_heads, capacity, dim] layout, read through view_read, gives the pool's bits."""
    counts, lengths = [3, 1, 5], [20, 64, 7]
    q, k, v, read, mask = rows_case(4, 2, 32, dtype, counts, lengths, seed=9)
    kv_len = mask.shape[-1]
    token = k.shape[1] * k.shape[2]
    views = []
    for t in (k, v):
        view = torch.full((3, 2, kv_len + 11, 32), float("nan"), dtype=dtype)  # spare capacity past kv_len
        for b in range(3):
            off, n = int(read.bases[b]) // token, int(read.kv_lens[b])
            view[b, :, :n] = t[off : off + n].transpose(0, 1)
            view[b, :, n:kv_len] = 0.5  # past the row's own entries: masked, finite
        views.append(view[:, :, :kv_len])
    for b in range(3):
        mask[b, 0, :, int(read.kv_lens[b]) :] = False
    from_pool = kernel.attend(q, k, v, read, mask, 0.2)
    from_view = kernel.attend(q, *views, paged_attention.view_read(views[0], read.starts.tolist(),
                                                                    read.counts.tolist()), mask, 0.2)
    assert torch.equal(from_pool, from_view)


def test_a_head_dim_without_whole_vectors_is_refused(kernel):
    q, k, v, read, mask = rows_case(2, 2, 12, torch.float32, [1, 2], [3, 4])
    assert not paged_attention.PagedKernel.supports(k.device, k.dtype, 12)
    with pytest.raises(ValueError, match="dim 12"):
        kernel.attend(q, k, v, read, mask, 0.3)


@pytest.mark.parametrize("how", ["no compiler", "switched off"])
def test_without_the_kernel_the_pool_is_gathered(how, tmp_path, monkeypatch):
    from lookahead.model.runner import ModelRunner

    from tests.lookahead.tiny_models import tiny

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet
    if how == "no compiler":
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    else:
        monkeypatch.setenv(native.ENV, "0")
    native.load.cache_clear()
    paged_attention.kernel.cache_clear()
    try:
        assert paged_attention.kernel() is None
        runner = ModelRunner(tiny("llama"))
        cache = runner.new_batch_cache(2, 16)
        assert cache.paged is None
        for p in ([3, 4, 5], [6]):
            single = runner.new_cache(8)
            runner.prefill(single, p)
            cache.admit(single, 8)
        plan = cache.begin_forward(1)
        assert plan.read is None and plan.src is not None  # the gather
    finally:
        native.load.cache_clear()
        paged_attention.kernel.cache_clear()
