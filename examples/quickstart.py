"""reactor in a minute: open a database, write, read, count, expire, close.

python examples/quickstart.py            # a database in a temporary folder
python examples/quickstart.py state.db   # that file (run it twice: state persists)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import reactor


def run(path: Path) -> None:
    with reactor.open(path) as state:  # created, with its folder, if missing
        orders = state.scope("orders")  # one actor owns the writes to this scope

        change = orders.set("o-1", {"total": 120, "status": "new"})
        print("set o-1:", change)  # Change(old_value=..., new_value=...)
        print("get o-1:", orders.get("o-1"))
        print("get o-9:", orders.get("o-9", "absent"))

        print("count:", orders.increment("count"))  # a missing key starts at 0
        orders.push("history", "o-1")
        print("history:", orders.get("history"))

        paid = {"total": 120, "status": "paid"}
        print("o-1 new -> paid:", orders.compare_and_swap("o-1", change.new_value, paid))

        orders.set("session", {"user": 7}, ttl=0.2)  # expires in 0.2 s
        print(f"session ttl: {orders.ttl('session'):.1f} s")
        time.sleep(0.25)
        print("session after 0.25 s:", orders.get("session"))  # gone at its deadline

        print("keys o-*:", orders.keys("o-*"))
        print("scopes:", state.scopes())
    # Leaving the with block closed the handle: queued writes are done, actors stopped.


def main() -> None:
    if len(sys.argv) > 1:
        run(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as folder:
        run(Path(folder) / "state.db")


if __name__ == "__main__":
    main()
