"""SAC hyperparameters. Defaults are the usual MuJoCo settings of Haarnoja et al. (2018b)."""

import dataclasses

from gorila_jax import config_checks, replay

CHOICES = {
    "precision": ("fp32", "bf16"),
    "actor_params_dtype": ("float32", "bfloat16"),
    "replay_obs_dtype": tuple(replay.STORAGE_DTYPES),
}

# Polyak steps every this many learner steps on one machine: TD3's delayed
# target update (Fujimoto et al., 2018). The distributed default below is half.
SINGLE_MACHINE_TARGET_UPDATE_PERIOD = 2


@dataclasses.dataclass
class SACConfig:
    """Soft actor-critic with twin Q networks and a learned temperature (Haarnoja et al., 2018b).

    Distributed specifics (the project brief, section 5.2):
    - the temperature alpha is one global value: its gradient is averaged over
      all learner devices, so every shard holds the same alpha;
    - actors act on a published copy of the policy parameters while the
      learner writes the next (a double buffer; see `SACBuilder.actor_params`);
    - the target networks are updated twice as often as on one machine:
      `target_update_period` defaults to 1 learner step, half of the
      single-machine default of 2 (`SINGLE_MACHINE_TARGET_UPDATE_PERIOD`), as
      the brief prescribes for distributed SAC ("target network update
      interval shortened by 50%").

    Attributes:
      hidden_sizes: widths of the ReLU layers of the policy and of each critic.
      discount: per-step discount gamma.
      n_step: length of the return actors write (1 is plain SAC).
      actor_learning_rate: Adam step size of the policy.
      critic_learning_rate: Adam step size of the twin critics.
      alpha_learning_rate: Adam step size of log(alpha).
      initial_alpha: the temperature at learner step 0.
      target_entropy_per_dim: the target entropy is this times |A|; the
        default -1 gives Haarnoja et al.'s -|A|.
      tau: Polyak factor: target <- tau * online + (1 - tau) * target.
      target_update_period: learner steps between Polyak steps (see above).
      log_std_min: smallest log standard deviation of the pre-tanh Gaussian.
      log_std_max: largest log standard deviation of the pre-tanh Gaussian.
      batch_size: global batch, split evenly over learner devices.
      samples_per_insert: replay ratio the rate limiter holds (items sampled
        per item inserted); batch_size gives one update per env step.
      updates_per_dispatch: updates the learner runs in one device call, on that many
        batches sampled in one go (as DQNConfig's). The one-host sync learner only.
      min_replay_size: items in replay before the learner may sample.
      max_replay_size: replay capacity; the oldest items leave first.
      random_steps: env steps, summed over all actors, of uniformly random
        actions before the policy acts (each of N actors takes random_steps / N).
      precision: "fp32", or "bf16" (float32 parameters and optimizer state,
        bfloat16 activations and matmuls; log-probs and losses stay float32).
      actor_params_dtype: "float32" or "bfloat16": the dtype the policy
        parameters travel to actors in.
      replay_obs_dtype: how replay stores float observations: "float32" (as
        they are), "bfloat16" (2 bytes a number) or "float8_e4m3" (1 byte, with a
        per-feature scale fixed from a random policy's observations); the
        learner decodes them on its device (gorila_jax/replay/compact.py).
      hot_replay_size: 0: the whole replay in memory. N > 0: a tiered replay
        (gorila_jax/replay/tiers.py, docs/tiered_replay.md): the newest N items in
        memory, older ones on disk under --replay_cold_dir.
      cold_replay_size: the items on disk; 0: the rest of max_replay_size.
      demo_fraction: the share of every learner batch drawn from demonstrations
        (`--demos`, docs/demonstrations.md); 0 (the default): none.
    """

    hidden_sizes: tuple[int, ...] = (256, 256)
    discount: float = 0.99
    n_step: int = 1
    actor_learning_rate: float = 3e-4
    critic_learning_rate: float = 3e-4
    alpha_learning_rate: float = 3e-4
    initial_alpha: float = 1.0
    target_entropy_per_dim: float = -1.0
    tau: float = 0.005
    target_update_period: int = SINGLE_MACHINE_TARGET_UPDATE_PERIOD // 2
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    batch_size: int = 256
    samples_per_insert: float = 256.0
    updates_per_dispatch: int = 1
    min_replay_size: int = 5_000
    max_replay_size: int = 1_000_000
    random_steps: int = 5_000
    precision: str = "fp32"
    actor_params_dtype: str = "float32"
    replay_obs_dtype: str = "float32"
    hot_replay_size: int = 0
    cold_replay_size: int = 0
    demo_fraction: float = 0.0

    def target_entropy(self, action_dim: int) -> float:
        """The entropy the temperature steers the policy towards: -|A| by default."""
        return self.target_entropy_per_dim * action_dim

    @property
    def replay_tiers(self) -> tuple[int, int] | None:
        """(hot, cold) items of a tiered replay; None: all in memory."""
        return config_checks.replay_tiers(
            self.hot_replay_size, self.cold_replay_size, self.max_replay_size, self.min_replay_size
        )

    def validate(self, num_devices: int) -> None:
        """Raises ValueError naming the first field whose value cannot work."""
        if self.precision == "fp16":
            raise ValueError(
                "config.precision='fp16' needs dynamic loss scaling, which SAC does not "
                "implement; use 'bf16'"
            )
        config_checks.check_fields(
            self,
            prefix="config.",
            choices=CHOICES,
            positive=(
                "n_step",
                "actor_learning_rate",
                "critic_learning_rate",
                "alpha_learning_rate",
                "initial_alpha",
                "target_update_period",
                "batch_size",
                "samples_per_insert",
                "updates_per_dispatch",
                "min_replay_size",
                "max_replay_size",
            ),
            non_negative=("random_steps",),
            unit_interval=("discount", "tau"),
        )
        config_checks.check_demo_fraction(self.demo_fraction, self.batch_size)
        self.replay_tiers  # noqa: B018  raises ValueError for bad tier sizes
        if not self.hidden_sizes or any(size <= 0 for size in self.hidden_sizes):
            raise ValueError(f"config.hidden_sizes must be positive, got {self.hidden_sizes}")
        if self.log_std_min >= self.log_std_max:
            raise ValueError(
                f"config.log_std_min={self.log_std_min} must be below "
                f"config.log_std_max={self.log_std_max}"
            )
        if self.min_replay_size > self.max_replay_size:
            raise ValueError(
                f"config.min_replay_size={self.min_replay_size} exceeds "
                f"config.max_replay_size={self.max_replay_size}"
            )
        batch_name = "batch_size"
        if getattr(self, batch_name) > self.max_replay_size:
            # Sampling draws with replacement, so it would run, on duplicates alone.
            raise ValueError(
                f"config.{batch_name}={getattr(self, batch_name)} exceeds "
                f"config.max_replay_size={self.max_replay_size}: a batch larger than the replay"
            )
        if self.batch_size % num_devices:
            raise ValueError(
                f"config.batch_size={self.batch_size} must be divisible by the "
                f"{num_devices} learner devices"
            )
