"""Federated tasks: datasets, partitioners, models and the clustering task."""
