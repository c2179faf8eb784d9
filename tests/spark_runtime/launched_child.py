"""The child of the launcher's tests (`python -m tests.spark_runtime.launched_child NAME...`):
prints, as one JSON line on stdout, the values of the environment variables NAME... (None when
unset), its session id, its pid and its nice level as it sees them, and one line on stderr;
then sleeps for a minute, so that the test can look at it from outside while it runs."""

import json
import os
import sys
import time

if __name__ == "__main__":
    seen = {
        "env": {name: os.environ.get(name) for name in sys.argv[1:]},
        "sid": os.getsid(0),
        "pid": os.getpid(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    print(json.dumps(seen), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    time.sleep(60)
