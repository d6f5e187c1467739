"""Tests of ``server/``."""
