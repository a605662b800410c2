"""`python -m lookahead.model.convert {qwen1,chatglm3} SRC DST`: convert a legacy checkpoint folder once."""

import argparse
import logging
import sys

from lookahead.model.convert.checkpoint import UnsupportedCheckpointError
from lookahead.model.convert.converter import convert
from lookahead.model.convert.families import FAMILIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lookahead.model.convert",
        description="Convert a remote-code checkpoint into a natively supported transformers architecture "
                    "with identical outputs: " + ", ".join(f"{f.name} -> {f.native}" for f in FAMILIES.values()))
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("src", help="checkpoint folder: config.json, weights, tokenizer files")
    parser.add_argument("dst", help="output folder (must not exist, or be empty)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        convert(args.family, args.src, args.dst)
    except (UnsupportedCheckpointError, FileExistsError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
