"""The laptop-scale replication recipe."""
