"""Record plain greedy outputs of the shipped prompt sets for `plan_replay` (benchmarks/greedy_smollm2.json).

    python -m benchmarks.record_greedy --limit 20

Each set's first `--limit` prompts, through the chat template, `generate`d
greedily for 128 new tokens by SmolLM2-135M-Instruct. Prompts already in the
file are kept, after the first of each set is generated again and checked
to be token for token what the file holds (a different model build or
library would otherwise mix two models' outputs in one file). Timing plays
no part, so it may run on a busy machine.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from lookahead.model.models import encode, load_model
from loadtest.prompt_sets import SETS, prompt_path, read_prompts
from lookahead.model.reference import hf_generate

from .plan_replay import RECORDED

MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 128


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20, help="prompts per set")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--out", type=Path, default=RECORDED)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recorded = json.loads(args.out.read_text()) if args.out.exists() else {}
    lm = load_model(MODEL, dtype="float32", device="cpu")
    for name in args.sets.split(","):
        have = {r["id"]: r for r in recorded.get(name, [])}
        rows = []
        for i, p in enumerate(read_prompts(prompt_path(name), args.limit)):
            ids = encode(lm.tokenizer, p["prompt"], chat=True)
            old = have.get(p["id"])
            if old is not None and old["prompt_ids"] != ids:
                sys.exit(f"{args.out}: {p['id']}'s prompt ids differ from this tokenizer's; record into a new file")
            if old is None or i == 0:
                out = hf_generate(lm.model, ids, NEW_TOKENS, lm.eos_token_ids).tokens
                if old is not None and old["out"] != out:
                    sys.exit(f"{args.out}: {p['id']}'s recorded output is not what this model generates; "
                             "record into a new file")
                old = {"id": p["id"], "prompt_ids": ids, "out": out}
                print(f"{p['id']}: {len(out)} tokens", flush=True)
            rows.append(old)
        recorded[name] = rows
        args.out.write_text(json.dumps(recorded))  # after every set, so an interrupted run keeps its work
    return 0


if __name__ == "__main__":
    sys.exit(main())
