"""The bus under load (`relax bench bus`): put/get throughput against memcpy and Ray's object store."""
