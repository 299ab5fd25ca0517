"""Learning: the learner step, its replay-fed nodes, and checkpoints."""
