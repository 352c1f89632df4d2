"""Building Redis clients: one place decides single node or Redis Cluster for every process."""
