"""The house's rules of direction, checked on every ``make test``."""
