"""The side-by-side strategy benchmark's pure parts: ground truth, measurement and the report.

No Django imports: the runner that drives real jobs is console/services/bench.py.
"""
