"""Infrastructure shared by every Django app: live broadcasts and the embedded Redis.

No models and no app imports: ``tenancy``, ``inventory``, ``jobs`` and ``portal``
all build on it, so it sits at the bottom of the Django ring.
"""
