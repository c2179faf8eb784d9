"""Overview page: jobs, episodes, nodes and cluster utilisation."""
