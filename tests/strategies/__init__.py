"""Tests of ``strategies/``."""
