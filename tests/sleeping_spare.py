"""A stand-in for a warm spare (`python -m tests.sleeping_spare --node N --spare-id ID ...`) that
never reads its commands, as a real spare does not while busy: the agent must know the replica it
handed it all the same. Sleeps for a minute."""

import time

if __name__ == "__main__":
    time.sleep(60)
