"""Resources page: CPU, memory, disk and network per node over time."""
