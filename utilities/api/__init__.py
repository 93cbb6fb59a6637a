"""What every app's REST API shares and no app owns: serializer bases.

It sits in ``utilities``, the lowest Django ring, so that ``tenancy``,
``inventory``, ``jobs`` and the apps above may all build on it.  What the
project names in its settings (the exception handler, the default pagination
and parser, the schema's hooks) stays in ``portal.api``.
"""
