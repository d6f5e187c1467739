"""Tests of ``privacy/``."""
