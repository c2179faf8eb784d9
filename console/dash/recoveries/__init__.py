"""Recovery timelines: throughput and latency with faults and recovery windows, episodes."""
