"""Placement page: nodes by resource score Q, idle rates, primaries and standbys, the reserve."""
