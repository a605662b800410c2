"""Three arms per round, order rotating: lookahead with the payoff check, without it, and off."""
import sys

from common import load, three_arms
from lookahead.payoff import Payoff

setname, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dec, prompts, stop = load(setname, 16, 64)
state = {"pay": True}
orig_allow = Payoff.allow
Payoff.allow = lambda self, rows: orig_allow(self, rows) if state["pay"] else True
rate = three_arms(dec, prompts, stop, conc, rounds, state)
print(f"{setname} c{conc} {rounds} rounds: pay/off {rate['pay'] / rate['off']:.3f}  nopay/off {rate['nopay'] / rate['off']:.3f}  "
      f"(tok/s pay {rate['pay']:.1f} nopay {rate['nopay']:.1f} off {rate['off']:.1f})", flush=True)
