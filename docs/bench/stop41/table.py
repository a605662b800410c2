"""The single-stream campaign's table: python docs/bench/stop41/table.py DIR [COMMIT...] (files DIR/<commit>-<set>.json).

Per commit and set, against HF generate in the same run: the engine's plain loop and lookahead, end to end and
over the decode phase, and lookahead over the plain loop (the two shares of the lead)."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
files = sorted(out.glob("*.json"), key=lambda p: p.stat().st_mtime)
order = sys.argv[2:] or list(dict.fromkeys(p.name.split("-")[0] for p in files))
print("| commit | set | plain / generate (decode) | lookahead / generate (decode) | lookahead / plain (decode) "
      "| tokens a step | identical |")
print("|---|---|---|---|---|---|---|")
for c in order:
    for p in sorted(out.glob(f"{c}-*.json")):
        s = json.loads(p.read_text())["summary"]
        name = p.stem.split("-", 1)[1]
        la_plain = s["own_plain_s"] / s["lookahead_s"] if "own_plain_s" in s else s["speedup"] / s["own_plain_speedup"]
        dec = s["decode_speedup"] / s["own_plain_decode_speedup"]
        print(f"| {c} | {name} | {s['own_plain_speedup']:.2f}x ({s['own_plain_decode_speedup']:.2f}x) "
              f"| {s['speedup']:.2f}x ({s['decode_speedup']:.2f}x) | {la_plain:.2f}x ({dec:.2f}x) "
              f"| {s.get('mean_accepted_tokens', s.get('mean_accepted', float('nan'))):.2f} | {s['identical']} |")
