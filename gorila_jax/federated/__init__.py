"""Federated training's parts: client-level differential privacy and secure aggregation."""
