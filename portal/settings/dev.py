"""The embedded default: what ``make run`` uses on a laptop or a fresh machine."""

from portal.settings.base import *  # noqa: F403
from portal.settings.env import env_bool

DEBUG = env_bool("DEBUG", True)
