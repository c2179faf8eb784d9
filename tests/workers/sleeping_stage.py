"""A stand-in for a stage process (`python -m tests.workers.sleeping_stage --job J --replica-id
R --node N ...`): it carries a stage's command line, so the node agent finds it as a stage would
be found, but starts no Spark. Sleeps for a minute."""

import time

if __name__ == "__main__":
    time.sleep(60)
