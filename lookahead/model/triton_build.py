"""The project's Triton kernels built for an NVIDIA GPU on a machine without one, and what ptxas made of them.

The interpreter (TRITON_INTERPRET=1) proves a kernel's algorithm on the CPU, but not that the GPU compiler
accepts it, nor what it costs in registers: a kernel that spills to local memory, or holds so many registers
that few warps fit on an SM, is slow whatever its algorithm. Triton's compiler and ptxas run without a GPU,
so this module builds each kernel for a named target (sm_90: H100 and H200) from a launch recorded on the CPU:

    with captured() as launches:
        tree_attention.attend(...)          # recorded, not run: the arguments a CUDA launch would get
    builds = [build(launch) for launch in launches]

A recorded launch is the one the GPU would make (bf16 outputs, no interpreter widening), and its signature,
constexprs and alignment hints come from Triton's own binder, so the build is the JIT's, specialised the
same way. `KernelBuild` is ptxas's resource use (cuobjdump -res-usage of the cubin).

The builds must run in a process that imported Triton without TRITON_INTERPRET=1 (under it, Triton's own
library functions are made for the interpreter and cannot be compiled): the test suite interprets, so it runs
this module's command in a subprocess:

    TRITON_INTERPRET=0 python -m lookahead.model.triton_build [--models Qwen2-7B ...] [--kernels attention]

prints one JSON line a distinct specialisation: kernel, constexprs, warps, registers, spills, warps an SM holds.
"""

import argparse
import json
import os
import re
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator
from unittest import mock

import torch

from lookahead.model import flagships
from lookahead.model.flagships import FLAGSHIPS, Shape

H100 = 90  # the compute capability of H100 and H200 (sm_90)
H100_SMS = 132
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64


@dataclass(frozen=True)
class Launch:
    """One kernel launch as recorded: the JITFunction, its grid, and its arguments."""

    kernel: Any  # triton.runtime.jit.JITFunction
    grid: tuple
    args: tuple
    kwargs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


@dataclass(frozen=True)
class KernelBuild:
    """What ptxas made of one specialisation of a kernel."""

    name: str
    constexprs: dict  # name -> value
    num_warps: int
    registers: int  # per thread
    stack_bytes: int  # the stack frame: spilled registers (the kernels call nothing)
    shared_bytes: int
    local_bytes: int

    @property
    def spills(self) -> bool:
        return self.stack_bytes > 0 or self.local_bytes > 0

    @property
    def warps_per_sm(self) -> int:
        """Resident warps an SM holds by registers alone (allocated per warp in units of 256)."""
        per_warp = -(-self.registers * 32 // 256) * 256
        blocks = REGISTERS_PER_SM // (per_warp * self.num_warps)
        return min(MAX_WARPS_PER_SM, blocks * self.num_warps)


class _Recorder:
    """Stands in for a jitted kernel: `k[grid](*args, **kwargs)` appends a Launch instead of running."""

    def __init__(self, kernel: Any, sink: list[Launch]) -> None:
        self.kernel, self.sink = kernel, sink

    def __getitem__(self, grid: tuple):
        def launch(*args, **kwargs):
            self.sink.append(Launch(self.kernel, tuple(grid), args, kwargs))

        return launch


@contextmanager
def captured() -> Iterator[list[Launch]]:
    """Within it, the project's Triton kernels record their launches instead of running, as on CUDA: outputs in
    the input's dtype, no interpreter widening (the outputs are left unwritten)."""
    from triton.runtime.jit import JITFunction

    from lookahead.model import tree_attention, triton_gemm

    sink: list[Launch] = []
    attn = tuple(_Recorder(k, sink) for k in tree_attention.make_kernels(JITFunction))
    gemm = tuple(_Recorder(k, sink) for k in triton_gemm.make_kernels(JITFunction))
    with mock.patch.object(tree_attention, "interpreting", lambda: False), \
            mock.patch.object(tree_attention, "_kernels", lambda interpret: attn), \
            mock.patch.object(triton_gemm, "_kernels", lambda interpret: gemm):
        yield sink


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _specialised(launch: Launch, arch: int) -> tuple:
    """(target, signature, constexprs, attrs, options): what Triton's binder makes of `launch`'s arguments."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    return (target, *fn._pack_args(backend, launch.kwargs, bound, specialization, options))


def build(launch: Launch, arch: int = H100) -> KernelBuild:
    """Compile `launch`'s kernel for sm_`arch` as the JIT would for these arguments, and read its resources."""
    import triton
    from triton.compiler import ASTSource

    fn = launch.kernel
    target, options, signature, constexprs, attrs = _specialised(launch, arch)
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    assert found, f"no resource usage in cuobjdump's output: {usage!r}"
    reg, stack, _, local = (int(x) for x in found.groups())
    shared = compiled.metadata.shared  # (dynamic shared memory, which cuobjdump's static count leaves out)
    return KernelBuild(fn.fn.__name__, _named(fn, constexprs), options.num_warps, reg, stack, shared, local)


def _named(fn, constants: dict) -> dict:
    """A specialisation's constants {(argument index,): value} by argument name."""
    return {fn.arg_names[path[0]]: value for path, value in constants.items()}


def compiled(kernels) -> list[dict]:
    """What the JIT compiled for `kernels` (jitted Triton functions) on this process's GPU: each
    specialisation's constexprs, registers and spills, as ptxas reported them there (the offline build's check
    on the device). Interpreted kernels compile nothing: []."""
    out = []
    for kernel in kernels:
        for caches in getattr(kernel, "device_caches", {}).values():
            for binary in caches[0].values():
                binary._init_handles()  # (loads the binary if it was not yet: sets n_regs and n_spills)
                constants = getattr(getattr(binary, "src", None), "constants", None) or {}
                out.append({"kernel": kernel.fn.__name__, "num_warps": binary.metadata.num_warps,
                            "constexprs": {k: v for k, v in _named(kernel, constants).items()
                                           if isinstance(v, (bool, int, float, str))},
                            "registers": binary.n_regs, "spill_bytes": binary.n_spills})
    return out


def distinct(launches: list[Launch], arch: int = H100) -> list[Launch]:
    """One launch per specialisation (kernel, types, constexprs, alignment): what the JIT compiles once."""
    seen, out = set(), []
    for launch in launches:
        _, options, signature, constexprs, attrs = _specialised(launch, arch)
        key = (launch.name, str(options), str(signature), str(sorted(constexprs.items())), str(sorted(attrs.items())))
        if key not in seen:
            seen.add(key)
            out.append(launch)
    return out


STEPS = ((1, 1, 100), (1, 1, 2048), (32, 16, 2048))  # (rows, width, context): one chunk, split, widest


def attention_launches(shape: Shape, rows: int, width: int, context: int) -> list[Launch]:
    """The launches of one layer's tree_attention.attend for a step of `rows` x `width` at `context`."""
    from lookahead.model import tree_attention

    q = torch.zeros(rows * width, shape.heads, shape.head_dim, dtype=torch.bfloat16)
    pool = torch.zeros(rows * (context + width) + 1, shape.kv_heads, shape.head_dim, dtype=torch.bfloat16)
    ints = lambda *size: torch.zeros(*size, dtype=torch.int64)  # noqa: E731
    with captured() as launches:
        tree_attention.attend(q, pool, pool, ints(rows), ints(rows), ints(rows * width), ints(rows * width, width),
                              ints(rows), rows, width, shape.head_dim ** -0.5, context + width)
    return launches


def linear_launches(out_features: int, in_features: int, bias: bool, rows: int, sms: int = H100_SMS) -> list[Launch]:
    """The launches of TritonLinear.mm for an [out, in] bf16 weight at `rows`, split for a GPU of `sms` SMs."""
    from lookahead.model import triton_gemm

    mod = torch.nn.Linear(1, 1, bias=bias)
    mod.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=torch.bfloat16), False)
    if bias:
        mod.bias = torch.nn.Parameter(torch.zeros(out_features), False)
    with captured() as launches, mock.patch.object(triton_gemm, "CPU_SMS", sms):
        triton_gemm.TritonLinear(mod).mm(torch.zeros(rows, in_features, dtype=torch.bfloat16), mod)
    return launches


def model_launches(shape: Shape, kernels: tuple[str, ...]) -> list[Launch]:
    """Every specialisation a model's steps launch: attention at STEPS; each of its linears at 1 and 512 rows."""
    out = []
    if "attention" in kernels:
        out += [launch for step in STEPS for launch in attention_launches(shape, *step)]
    if "gemm" in kernels:
        out += [launch for lin in shape.linears for rows in (1, 512)
                for launch in linear_launches(lin.out_features, lin.in_features, lin.bias, rows)]
    return distinct(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(FLAGSHIPS), choices=list(FLAGSHIPS))
    ap.add_argument("--kernels", nargs="+", default=["attention", "gemm"], choices=["attention", "gemm"])
    ap.add_argument("--arch", type=int, default=H100, help="compute capability x 10 (90: H100, H200)")
    args = ap.parse_args(argv)
    for model in args.models:
        for launch in model_launches(flagships.shape(model), tuple(args.kernels)):
            b = build(launch, args.arch)
            print(json.dumps({"model": model, "kernel": b.name, "constexprs": b.constexprs, "num_warps": b.num_warps,
                              "registers": b.registers, "stack_bytes": b.stack_bytes, "local_bytes": b.local_bytes,
                              "shared_bytes": b.shared_bytes, "spills": b.spills, "warps_per_sm": b.warps_per_sm}),
                  flush=True)


if __name__ == "__main__":
    main()
