#!/usr/bin/env python
"""Django's command-line utility for the portal."""

import os
import sys


def main() -> None:
    """Run a management command (settings default to the environment alone; see DEFAULT_SETTINGS)."""
    from portal.settings import DEFAULT_SETTINGS

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
