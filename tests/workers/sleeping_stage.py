"""A stand-in for a stage process (`python -m tests.workers.sleeping_stage --job J --replica-id
R --node N ...`): it carries a stage's command line, so the node agent finds it as a stage would
be found, but starts no Spark. Sleeps for a minute; with `--hold-mb N` it first fills N MiB of
memory, so that, like a stage's JVM, it takes a while to be gone after a SIGKILL."""

import sys
import time

if __name__ == "__main__":
    held = b""
    if "--hold-mb" in sys.argv:
        held = b"x" * (int(sys.argv[sys.argv.index("--hold-mb") + 1]) * 1024 * 1024)
    time.sleep(60)
