"""The benchmarks: `python -m benchmarks.bench` and friends, run from the repository root.

Outside the library's import path: the library never imports them."""
