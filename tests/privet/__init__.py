"""Tests of ``privet/``."""
