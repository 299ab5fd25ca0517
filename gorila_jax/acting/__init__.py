"""Acting: actor nodes, the evaluator, and the per-host parameter cache."""
