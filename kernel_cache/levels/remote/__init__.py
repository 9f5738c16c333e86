"""The remote level: Redis (one server or a cluster), our own link, reader and leases."""
