"""``python -m fabric``: see :mod:`fabric.cli`."""

from fabric.cli import main

raise SystemExit(main())
