"""Generate text from one prompt with lookahead decoding, streaming it to the terminal.

    python -m lookahead.cli "Write a haiku about the sea."
"""

import argparse
import logging
import sys

from lookahead.config import MODES, LookaheadConfig
from lookahead.engine.generate import LookaheadDecoder
from lookahead.engine.sequence import StopCriteria
from lookahead.model.models import encode, load_model
from lookahead.model.runner import ModelRunner
from lookahead.model.sampling import SamplingParams


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lookahead.cli", description=__doc__.split("\n\n")[0])
    p.add_argument("prompt")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--no-chat", action="store_true", help="send the prompt raw, without the chat template")
    p.add_argument("--no-lookahead", action="store_true")
    p.add_argument("--decoding-length", type=int, default=64)
    p.add_argument("--branch-length", type=int, default=12)
    p.add_argument("--mode", choices=MODES, default="hier")
    p.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    lm = load_model(args.model)
    runner = ModelRunner(lm.model)
    runner.check_tree_masks()
    cfg = LookaheadConfig(enabled=not args.no_lookahead, decoding_length=args.decoding_length,
                          branch_length=args.branch_length, decoding_mode=args.mode)
    decoder = LookaheadDecoder(runner, cfg, lm.tokenizer, eos_token_ids=lm.eos_token_ids)
    sampling = SamplingParams(do_sample=args.temperature is not None, temperature=args.temperature or 1.0,
                              top_p=args.top_p, seed=args.seed)
    ids = encode(lm.tokenizer, args.prompt, chat=not args.no_chat)
    run = decoder.stream(ids, stop=StopCriteria(args.max_new_tokens, frozenset(lm.eos_token_ids)), sampling=sampling)
    shown = ""
    for _ in run:
        text = lm.tokenizer.decode(run.tokens, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    st = run.stats
    print(f"\n\n[{st.new_tokens} tokens in {st.total_s:.2f}s, {st.new_tokens / st.total_s:.1f} tok/s; "
          f"{st.steps} steps, {st.mean_accepted:.2f} tokens/step; finish: {run.finish_reason}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
