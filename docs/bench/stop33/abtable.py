"""The A/B's table: tokens/s new / old per prompt set, concurrency and arm (lookahead on, plain), each side the
mean of its runs, from the logs docs/bench/stop32/ab.sh writes.   python docs/bench/stop33/abtable.py OUT_DIR"""

import re
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean

LINE = re.compile(r"^concurrency\s+(\d+) \| on\s+([\d.]+) tok/s\s+off\s+([\d.]+) tok/s")
runs = defaultdict(list)  # (set, commit, concurrency) -> [(on, off)]
for log in sorted(Path(sys.argv[1]).glob("*.log")):
    pset, commit = re.match(r"(\w+)-(old|new)\d+", log.stem).groups()
    for m in map(LINE.match, log.read_text().splitlines()):
        if m:
            runs[pset, commit, int(m[1])].append((float(m[2]), float(m[3])))
for pset in sorted({k[0] for k in runs}):
    print(f"\n{pset}: tok/s old -> new (mean of runs), ratio new/old")
    print("| in flight | lookahead old | lookahead new | ratio | plain old | plain new | ratio |")
    print("|---|---|---|---|---|---|---|")
    for c in sorted({k[2] for k in runs if k[0] == pset}):
        old, new = runs.get((pset, "old", c)), runs.get((pset, "new", c))
        if not old or not new:
            continue
        lo, ln = mean(r[0] for r in old), mean(r[0] for r in new)
        po, pn = mean(r[1] for r in old), mean(r[1] for r in new)
        print(f"| {c} | {lo:.1f} | {ln:.1f} | {ln / lo:.2f} | {po:.1f} | {pn:.1f} | {pn / po:.2f} |")
