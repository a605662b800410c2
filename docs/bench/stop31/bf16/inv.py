# does row 0 of x @ W.T come out bitwise the same whatever the number of rows? (bf16 and fp32, several kernels)
import torch, torch.nn.functional as F, sys
torch.manual_seed(0)
K, N = 576, 1536
for dt in (torch.bfloat16, torch.float32):
    W = torch.randn(N, K).to(dt)
    X = torch.randn(64, K).to(dt)
    kernels = {
        "F.linear": lambda x: F.linear(x, W),
        "W@x.T": lambda x: (W @ x.t()).t(),
        "x@W.T": lambda x: x @ W.t(),
        "fp32 x@W.T": lambda x: (x.float() @ W.float().t()).to(dt),
        "fp32 F.linear": lambda x: F.linear(x.float(), W.float()).to(dt),
    }
    for name, f in kernels.items():
        ref = f(X[:1].repeat(2, 1))[:1]
        bad = [m for m in range(1, 65) if not torch.equal(f(X[:m])[:1], ref)]
        print(dt, name, "differs at M =", bad[:12], len(bad))
