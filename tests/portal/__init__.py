"""Tests of the portal app."""
