"""A PostgreSQL server of a test's own, which the test can crash and start again: for the test of
a database restart under a running job (the machine's server serves others; it is never
restarted by a test). The one implementation is the fleet simulator's (bench/fleet/services.py):
the machine's PostgreSQL binaries on a free port, data in a fresh directory, run as the
`postgres` user when the tests run as root.
"""

from bench.fleet.services import PrivatePostgres, default_database, postgres_bin_dir

__all__ = ["PrivatePostgres", "default_database", "postgres_bin_dir"]
