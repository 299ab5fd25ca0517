"""Anakin runs (`--launcher=anakin`, docs/anakin.md): a learner that acts in its own JAX
envs, keeps an off-policy agent's replay on its devices and learns, in one compiled loop,
with no replay or actor nodes."""
