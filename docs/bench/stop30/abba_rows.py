"""Three arms per round, order rotating: lookahead with the payoff check from 2 rows up (today), the check at every
size (min_rows 1, as before stop 30), and off."""
import sys

from common import load, three_arms
from lookahead.payoff import Payoff

setname, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dec, prompts, stop = load(setname, 16, 64)
state = {"pay": True}
orig_allow = Payoff.allow
def allow(self, rows):
    self.min_rows = 2 if state["pay"] else 1
    return orig_allow(self, rows)
Payoff.allow = allow
rate = three_arms(dec, prompts, stop, conc, rounds, state)
print(f"{setname} c{conc} {rounds} rounds: min_rows 2 / off {rate['pay'] / rate['off']:.3f}  "
      f"min_rows 1 / off {rate['nopay'] / rate['off']:.3f}  "
      f"(tok/s {rate['pay']:.1f} / {rate['nopay']:.1f} / {rate['off']:.1f})", flush=True)
