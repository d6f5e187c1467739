"""Tests of ``protocol/``."""
