"""Anakin runs (`--launcher=anakin`, docs/anakin.md): a learner that acts in its own JAX
envs and learns from them in one compiled loop, with no replay and no actor nodes."""
