"""Tests of the inventory app."""
