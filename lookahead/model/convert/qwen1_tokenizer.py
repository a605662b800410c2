"""Qwen(1)'s `qwen.tiktoken` -> a fast tokenizer, without Qwen's remote `QWenTokenizer`.

`qwen.tiktoken` lists byte-level BPE tokens as `base64(bytes) rank`, one a line; ranks are merge priority
and token id. transformers' tiktoken converter turns the ranks into BPE merges. Qwen(1) adds its own
pre-split pattern (single digits, unlike GPT-4's `\\p{N}{1,3}`), NFC normalization, and 208 special
tokens numbered right after the ranks: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|extra_0|>`..
`<|extra_204|>`. Chat is ChatML, with Qwen(1)'s default system prompt, as its `make_context` builds it.
"""

import base64
from pathlib import Path

from tokenizers import normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from lookahead.model.convert.checkpoint import UnsupportedCheckpointError

VOCAB_FILE = "qwen.tiktoken"
PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
           r"""|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
EOS = ["<|endoftext|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def read_ranks(path: str) -> dict[bytes, int]:
    """Parse a `.tiktoken` file. (tiktoken's own loader caches local files by path, which can go stale.)"""
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


class _Converter(TikTokenConverter):
    load_tiktoken_bpe = staticmethod(read_ranks)


def build(src: Path, model_max_length: int) -> PreTrainedTokenizerFast | None:
    """The fast tokenizer for the checkpoint in `src`, or None when it has no `qwen.tiktoken`."""
    path = src / VOCAB_FILE
    if not path.is_file():
        return None
    ranks = read_ranks(str(path))
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise UnsupportedCheckpointError(f"{path}: ranks are not 0..{len(ranks) - 1}, so they cannot be token ids")
    backend = _Converter(vocab_file=str(path), pattern=PATTERN, extra_special_tokens=SPECIALS).converted()
    backend.normalizer = normalizers.NFC()
    assert backend.token_to_id(SPECIALS[0]) == len(ranks), "specials must follow the ranks"
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
