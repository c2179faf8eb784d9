"""Job page: operator DAG, priorities and their history, decisions, failures, fault controls."""
