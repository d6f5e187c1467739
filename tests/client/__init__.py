"""Tests of ``client/``."""
