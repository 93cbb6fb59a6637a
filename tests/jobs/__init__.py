"""Tests of the jobs app."""
