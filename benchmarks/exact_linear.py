"""The exact linear's kernels against the stock bf16 one, per row count: ms for one forward's worth of matmuls.

SmolLM2-135M's linears (30 layers of q/k/v/o and the MLP, plus the tied lm_head), bf16, weights cold as in a real
forward (the whole set is streamed once per pass). Each output of `native` and `float64` is bitwise the same
whatever the row count; `F.linear` (oneDNN) is not, which is why exact forwards cannot use it.

    python benchmarks/exact_linear.py [--rows 1,2,4,8,16,32,64]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from lookahead.model import exact_linear
from lookahead.model.fast_linear import Float64Linear

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30
HEAD = (49152, 576)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    mods = []
    for out_f, in_f in [*SHAPES, HEAD]:
        mod = torch.nn.Linear(in_f, out_f, bias=False).to(torch.bfloat16)
        mod._lookahead_float64 = Float64Linear(mod)
        mods.append(mod)
    native = exact_linear.kernel()
    arms = {
        "F.linear (oneDNN bf16)": lambda x, m: F.linear(x, m.weight),
        "float64": lambda x, m: m._lookahead_float64(x, m),
        "native": lambda x, m: native(x, m.weight, None),
    }
    print(f"{'rows':>5} " + " ".join(f"{name:>24}" for name in arms))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {576: torch.randn(rows, 576).to(torch.bfloat16), 1536: torch.randn(rows, 1536).to(torch.bfloat16)}
        line = []
        for fn in arms.values():
            for m in mods:  # warm-up pass
                fn(xs[m.in_features], m)
            t0 = time.perf_counter()
            for _ in range(args.passes):
                for m in mods:
                    fn(xs[m.in_features], m)
            line.append((time.perf_counter() - t0) / args.passes * 1e3)
        print(f"{rows:>5} " + " ".join(f"{ms:>21.1f} ms" for ms in line), flush=True)


if __name__ == "__main__":
    main()
