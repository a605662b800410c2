"""ChatGLM3's SentencePiece `tokenizer.model` -> a fast tokenizer, without ChatGLM3's remote `ChatGLMTokenizer`.

The SentencePiece model holds the ordinary pieces (ids 0..n-1: `<unk>`, `<s>`, `</s>`, bytes, words);
ChatGLM3 numbers its 9 special tokens right after them: `[MASK]`, `[gMASK]`, `[sMASK]`, `sop`, `eop`,
`<|system|>`, `<|user|>`, `<|assistant|>`, `<|observation|>`. `sop` and `eop` become `<sop>` and `<eop>`
(same ids): as added tokens, bare `sop` would match inside words like "desoption".

ChatGLM3 prefixes every input with `[gMASK]<sop>`, and `build_chat_input` writes each turn as
`<|role|>` + encode(metadata + "\n") + encode(content), ending with `<|assistant|>`. SentencePiece's dummy
prefix makes encode(content) start with a space, hence the template's `\n ` before each content.
"""

from pathlib import Path

from tokenizers import AddedToken, processors
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

from lookahead.model.convert.checkpoint import UnsupportedCheckpointError

VOCAB_FILE = "tokenizer.model"
SPECIALS = ["[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
            "<|observation|>"]
EOS = ["</s>", "<|user|>", "<|observation|>"]  # a reply ends at </s> or when the model hands the turn back
ROLES = ["system", "user", "assistant", "observation"]
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages %}"
    "{%- if message['role'] not in " + repr(ROLES) + " %}"
    "{{- raise_exception('ChatGLM3 has no role ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|' + message['role'] + '|>' + message.get('metadata', '') + '\\n ' + message['content'] }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)


def build(src: Path, model_max_length: int) -> PreTrainedTokenizerFast | None:
    """The fast tokenizer for the checkpoint in `src`, or None when it has no `tokenizer.model`."""
    path = src / VOCAB_FILE
    if not path.is_file():
        return None
    proto = import_protobuf().ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as e:  # GLM-4's remote-code checkpoints ship a tiktoken file under this name
        raise UnsupportedCheckpointError(f"{path} is not a SentencePiece model, so not ChatGLM3's") from e
    n = len(proto.pieces)
    if proto.trainer_spec.model_type == 2:  # BPE
        vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    else:
        vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    if backend is None:
        kind = proto.trainer_spec.model_type
        raise UnsupportedCheckpointError(f"{path}: unsupported SentencePiece model type {kind}")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    assert backend.token_to_id(SPECIALS[0]) == n, "specials must follow the SentencePiece pieces"
    gmask, sop = n + SPECIALS.index("[gMASK]"), n + SPECIALS.index("<sop>")
    backend.post_processor = processors.TemplateProcessing(
        single="[gMASK] <sop> $A", pair="[gMASK] <sop> $A $B </s>",
        special_tokens=[("[gMASK]", gmask), ("<sop>", sop), ("</s>", proto.trainer_spec.eos_id)])
    pieces = [piece.piece for piece in proto.pieces]
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=pieces[proto.trainer_spec.unk_id],
        eos_token=pieces[proto.trainer_spec.eos_id],
        pad_token=pieces[proto.trainer_spec.unk_id],  # ChatGLM3 pads with <unk>, id 0
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
