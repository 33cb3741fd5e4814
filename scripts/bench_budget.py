"""What the budget check costs per usage report (issue 36).

``python -m scripts.bench_budget`` times, best of five rounds of 20,000, one usage report
through a turn's account (``TurnAccount.on_event``: the meter counts it) with and without the
budget check the turn makes after it (``spent`` on the meter's snapshot, all three budgets
set, one model priced by ``[prices]``), and, as a yardstick of the machine's load,
``sum(range(100))``. The check's cost is the difference.

``python -m scripts.bench_budget --overshoot`` prints how far past its budget each real CLI's
turn got before it was dead: it runs contract line 20's test (``tests/test_budget_stop.py``:
Claude Code, Codex and claude-agent-acp against the fake models, which keep calling tools), whose
daemon logs each budget stop's figures at the decision and once the turn is dead.
"""

from __future__ import annotations

import subprocess
import sys
import timeit
from decimal import Decimal

from adapters._base import Usage
from supervisor.core.account import TurnAccount
from supervisor.core.budget import Price, TurnLimits, spent

ROUNDS, NUMBER = 5, 20_000


def overshoot() -> None:
    """Run the contract's test and print each budget stop's line."""
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/test_budget_stop.py", "-q", "-s", "-p",
                          "no:cacheprovider"], capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if "budget stop " in line]
    print("\n".join(lines) if lines else out.stdout[-3000:] + out.stderr[-2000:])
    sys.exit(out.returncode)


def main() -> None:
    """Print the figures."""
    if "--overshoot" in sys.argv[1:]:
        overshoot()
    limits = TurnLimits(10**12, Decimal(10**6), 10**6)
    prices = {"m": Price(Decimal(3), Decimal(15))}
    report = Usage(1000, 50, 2000, model="m", cost=Decimal("0.001"), currency="USD")
    account = TurnAccount("agent:bench", "t-bench")

    def counted() -> None:
        account.on_event(report, silenced=False, now=0.0)

    def checked() -> None:
        account.on_event(report, silenced=False, now=0.0)
        spent(limits, account.meter.snapshot(), prices)

    def best(fn: object) -> float:
        return min(timeit.repeat(fn, number=NUMBER, repeat=ROUNDS)) / NUMBER * 1e6  # type: ignore[arg-type]

    yardstick = best(lambda: sum(range(100)))
    bare, full = best(counted), best(checked)
    print(f"usage report, counted: {bare:.1f} us; counted and checked: {full:.1f} us; "
          f"the check: {full - bare:.1f} us ({(full - bare) / yardstick:.1f} x sum(range(100)), "
          f"which took {yardstick:.2f} us)")


if __name__ == "__main__":
    main()
