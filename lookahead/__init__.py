"""Lookahead decoding for Hugging Face causal LMs: lossless, trie-drafted, tree-verified.

The top-level names load on first use, so the torch-free parts of the
package (the trie, the draft tree, prompt files) import without torch.
"""

_EXPORTS = {
    "LookaheadConfig": "config",
    "LookaheadDecoder": "engine.generate",
    "Generation": "engine.sequence",
    "StopCriteria": "engine.sequence",
    "SamplingParams": "model.sampling",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
