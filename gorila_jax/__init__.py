"""gorila-jax: the distributed skeleton (program graph, launchers, actor, replay, learner)."""
