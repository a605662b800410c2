"""Lookahead decoding for Hugging Face causal LMs: lossless, trie-drafted, tree-verified."""

from .config import LookaheadConfig
from .generate import LookaheadDecoder
from .sequence import Generation, StopCriteria
from .sampling import SamplingParams

__all__ = ["LookaheadConfig", "LookaheadDecoder", "Generation", "StopCriteria", "SamplingParams"]
