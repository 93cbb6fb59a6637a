"""Tests of the tenancy app."""
