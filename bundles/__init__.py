"""Code bundles: the archives of tenants' own training programs (upload, list, store)."""
