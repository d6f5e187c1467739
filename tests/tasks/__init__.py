"""Tests of ``tasks/``."""
