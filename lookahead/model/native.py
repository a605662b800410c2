"""The project's C++ kernels: compiled on first use with the machine's compiler, loaded with ctypes.

Each kernel is one self-contained source beside this file (`paged_attention.cpp`,
`exact_linear.cpp`) with a C entry point taking a struct of pointers and sizes:
no torch headers, so a build takes about a second, and nothing is built at
install time. Built with `-march=native` (the CPU's own vector instructions:
AVX-512 and its bf16 dot products where present) and `-fopenmp`, whose
threads come from the OpenMP runtime torch has already loaded (the same
`libgomp.so.1`), so the kernels share torch's thread pool instead of
fighting it.

Libraries go to `$XDG_CACHE_HOME/lookahead-serve/` (default `~/.cache`),
named by a hash of the source, the flags and the CPU's feature flags (a home
directory shared by different machines gets one library per kind of CPU). A
finished library is renamed into place, so processes building at once
(replicas, test workers) never load a half-written one.

`load()` gives None, once logged, where there is no compiler or the build
fails, or where `LOOKAHEAD_NATIVE=0`; every caller then keeps its pure
torch path.
"""

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
ENV = "LOOKAHEAD_NATIVE"


@cache
def load(name: str) -> ctypes.CDLL | None:
    """`name`.cpp beside this module, built (once per source, flags and CPU) and loaded; None where it cannot be."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        return ctypes.CDLL(str(build(name)))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        log.warning("native kernel %s unavailable (%s%s); its torch path runs instead", name, e,
                    f": {detail.decode(errors='replace')[-300:]}" if detail else "")
        return None


def build(name: str) -> Path:
    source = Path(__file__).with_name(f"{name}.cpp")
    digest = hashlib.sha256(source.read_bytes() + " ".join(FLAGS).encode() + _cpu_flags()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lookahead-serve"
    lib = root / f"{name}-{digest}.so"
    if lib.exists():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX") or "g++"
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        built = Path(tmp) / lib.name
        subprocess.run([cxx, *FLAGS, "-o", str(built), str(source)], check=True, capture_output=True, timeout=300)
        os.replace(built, lib)
    return lib


def _cpu_flags() -> bytes:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    return next((line for line in lines if line.startswith(("flags", "Features"))), "").encode()
