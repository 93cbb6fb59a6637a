"""``python -m portalctl``: the command line."""

from portalctl.cli import main

main()
