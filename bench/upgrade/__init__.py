"""The blue/green upgrade benchmark against stop-and-restart (manage.py bench_upgrade)."""
