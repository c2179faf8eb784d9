"""How a long benchmark command stops on SIGTERM: unwinding through its `finally`, which stops
every process it started."""

import signal
import sys


def exit_on_first_sigterm(*_args) -> None:
    """SIGTERM handler: unwind on the first one; a second one during the clean-up must not cut
    it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(1)
