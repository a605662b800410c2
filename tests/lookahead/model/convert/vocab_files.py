"""Synthetic tokenizer files in the legacy formats: a byte-level BPE `qwen.tiktoken`, a SentencePiece model."""

import base64
import collections
import functools
import io
import random
from pathlib import Path

WORDS = ("the quick brown fox jumps over lazy dog hello world sop eop desoption code def return print import "
         "lookahead decoding tree café naïve 你好 世界 模型 2024").split()


def corpus() -> list[str]:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)]
    return lines + ["def f(x):\n    return x + 1\n"] * 20


@functools.cache
def qwen_ranks(merges: int = 40) -> dict[bytes, int]:
    """256 single bytes, then the most frequent pair merges of the corpus, as tiktoken ranks."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([c]) for c in w.encode()] for line in corpus() for w in line.split(" ")]
    for _ in range(merges):
        (a, b), _count = collections.Counter(p for w in words for p in zip(w, w[1:])).most_common(1)[0]
        ranks[a + b] = len(ranks)
        merged = []
        for w in words:
            out, i = [], 0
            while i < len(w):
                if w[i:i + 2] == [a, b]:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged.append(out)
        words = merged
    return ranks


def write_qwen_tiktoken(folder: Path) -> dict[bytes, int]:
    ranks = qwen_ranks()
    (folder / "qwen.tiktoken").write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    return ranks


@functools.cache
def sentencepiece_model() -> bytes:
    """A BPE SentencePiece model with byte fallback and identity normalization, like ChatGLM3's."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=buf, vocab_size=400, model_type="bpe", byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, character_coverage=1.0, minloglevel=2)
    return buf.getvalue()


def write_sentencepiece(folder: Path) -> int:
    """Write `tokenizer.model`; return its number of pieces."""
    import sentencepiece as spm

    (folder / "tokenizer.model").write_bytes(sentencepiece_model())
    return spm.SentencePieceProcessor(model_proto=sentencepiece_model()).vocab_size()
