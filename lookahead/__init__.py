"""Lookahead decoding for Hugging Face causal LMs: lossless, trie-drafted, tree-verified."""

from .config import LookaheadConfig
from .generate import Generation, LookaheadDecoder, StopCriteria
from .sampling import SamplingParams

__all__ = ["LookaheadConfig", "LookaheadDecoder", "Generation", "StopCriteria", "SamplingParams"]
