"""Tests of the whole system: architecture, attacks on the running system, deployments."""
