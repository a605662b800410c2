"""Legacy remote-code checkpoints -> natively supported transformers architectures, with identical outputs.

Qwen(1) and ChatGLM3 ship their own modeling code (`trust_remote_code`), which ignores the 4D attention
masks lookahead verifies its draft trees with. Their weights, renamed and split, run unchanged in
transformers' `Qwen2ForCausalLM` and `GlmForCausalLM`, which take those masks.

Vocabulary: the *legacy* checkpoint is the source folder (config.json with `model_type` qwen or chatglm,
weights, tokenizer files); the *native* checkpoint is the converted folder that `from_pretrained` loads
without remote code.
"""

from lookahead.model.convert.checkpoint import UnsupportedCheckpointError
from lookahead.model.convert.converter import convert
from lookahead.model.convert.families import FAMILIES, detect

__all__ = ["FAMILIES", "UnsupportedCheckpointError", "convert", "detect"]
