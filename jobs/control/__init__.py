"""The control plane: scheduler tick, binding to the fabric, agent commands and reports.

Thin over the cores: ``scheduler`` decides sizes, ``fabric`` places them,
this package reads and writes the database and talks to the agents.
"""
