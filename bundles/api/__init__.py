"""The code bundles REST API (``/api/v1/code/``)."""
