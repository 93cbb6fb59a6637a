"""The audit log: who changed what, when, from where; written by the service that makes the change."""
