"""A CPU hog for the `stress-node` fault: `python -m workers.cpu_hog SECONDS NODE`.

It spins for SECONDS and exits; NODE is only a tag so node metrics count it against that node.
"""

import sys
import time


def main(argv: list[str]) -> int:
    deadline = time.monotonic() + float(argv[0])
    spins = 0
    while time.monotonic() < deadline:
        spins += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
