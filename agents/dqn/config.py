"""DQN hyperparameters. Defaults are the project brief's Atari settings (DESIGN.md section 4)."""

import dataclasses

from agents.dqn.networks import TORSOS
from gorila_jax import config_checks, replay

CHOICES = {
    "torso": ("auto", *TORSOS),
    "clip_mode": ("global", "layer"),
    "precision": ("fp32", "bf16", "fp16"),
    "actor_params_dtype": ("float32", "bfloat16"),
    "replay_obs_dtype": tuple(replay.STORAGE_DTYPES),
}


# The fields `validate` checks by range alone.
_POSITIVE = (
    "n_step",
    "learning_rate",
    "learning_rate_decay_steps",
    "batch_size",
    "target_update_period",
    "samples_per_insert",
    "updates_per_dispatch",
    "min_replay_size",
    "max_replay_size",
    "importance_exponent_anneal_steps",
    "epsilon_decay_steps",
    "initial_priority",
    "max_grad_norm",
    "layer_grad_norm",
    "loss_scale_init",
    "loss_scale_period",
    "batch_growth_steps",
)
_UNIT_INTERVAL = (
    "discount",
    "epsilon_start",
    "epsilon_end",
    "eval_epsilon",
    "importance_exponent_start",
    "epsilon_end_spread",
    "learning_rate_final_fraction",
)


@dataclasses.dataclass
class DQNConfig:
    """Double DQN with n-step returns and prioritized replay.

    Attributes:
      torso: "mlp" (vector observations), "nature" (the Nature DQN conv torso,
        Mnih et al., 2015), "impala" (the wider IMPALA residual torso,
        Espeholt et al., 2018), "minatar" (one small conv on [H, W, C] grids, Young and
        Tian, 2019), or "auto": nature for uint8 image stacks, minatar for grids, else mlp.
      hidden_sizes: widths of the MLP layers (the whole MLP torso, or the
        layers after a conv torso).
      dueling: split the head into value and advantage streams (Wang et al., 2016).
      layer_norm: LayerNorm before each hidden ReLU. It bounds the features
        the Q head is linear in, which keeps TD bootstrapping from diverging
        (Gallici et al., 2024, "Simplifying Deep Temporal Difference Learning";
        Ball et al., 2023).
      discount: per-step discount gamma.
      n_step: length of the n-step return written by actors.
      learning_rate: peak Adam step size, decayed by a cosine schedule.
      learning_rate_decay_steps: learner steps over which the cosine decays.
      learning_rate_final_fraction: the schedule's floor, as a fraction of the peak.
      adam_eps: Adam's epsilon.
      adam_b1: Adam's first-moment (momentum) decay. Asynchronous Gorila
        workers add momentum of their own (a gradient applied s updates late
        acts like momentum; Mitliagkas et al., 2016), so Gorila runs may want
        less here.
      max_grad_norm: global-norm clip applied before gradients are split.
      clip_mode: "global" clips the whole gradient to `max_grad_norm`; "layer"
        clips each layer's gradient to `layer_grad_norm` on its own.
      layer_grad_norm: per-layer norm threshold when clip_mode is "layer".
      precision: "fp32"; "bf16" (float32 parameters and optimizer state,
        bfloat16 activations and matmuls); "fp16" (the same in float16, with
        dynamic loss scaling).
      loss_scale_init: fp16's first loss scale.
      loss_scale_period: fp16 doubles the scale after this many finite steps.
      actor_params_dtype: "float32" or "bfloat16": the dtype parameters travel
        to actors in (bfloat16 halves the bytes; acting tolerates it).
      replay_obs_dtype: how replay stores float observations: "float32" (as
        they are), "bfloat16" (2 bytes a number) or "float8_e4m3" (1 byte, with a
        per-feature scale fixed from a random policy's observations); the
        learner decodes them on its device (gorila_jax/replay/compact.py).
      huber_delta: the Huber loss's quadratic-to-linear point.
      batch_size: global batch, split evenly over learner devices; the first
        size when the batch grows.
      batch_size_max: 0 keeps the batch fixed; otherwise the batch doubles
        from `batch_size` up to this size over `batch_growth_steps` learner steps.
      batch_growth_steps: learner steps over which the batch reaches its maximum.
      target_update_period: learner steps between target-network copies.
      samples_per_insert: replay ratio the rate limiter holds (items sampled per item inserted).
      updates_per_dispatch: updates the learner runs in one device call (a `lax.scan`), on
        that many batches sampled in one go; their priorities go back in one write. Fewer
        host round trips per update; the batches of one call are sampled with the
        priorities from before it. The one-host sync learner only.
      min_replay_size: items in replay before the learner may sample.
      max_replay_size: replay capacity; the oldest items leave first.
      priority_exponent: PER alpha.
      importance_exponent_start: PER beta at learner step 0, annealed linearly to 1.
      importance_exponent_anneal_steps: learner steps over which beta reaches 1.
      priority_epsilon: added to |TD error| so no item's priority is 0.
      initial_priority: priority of newly written items.
      priority_duplicate_bonus: eps of the duplicate-aware priority |TD error| + eps * sqrt(N),
        N the actors that wrote the same transition (`replay.DuplicateCounter`, brief 2.2);
        0 (the default) leaves priorities as they are. It lifts the transitions several
        actors found: those of deterministic envs with actors on the same seed.
      hot_replay_size: 0: the whole replay in memory. N > 0: a tiered replay
        (gorila_jax/replay/tiers.py, docs/tiered_replay.md): the newest N items in
        memory, older ones on disk under --replay_cold_dir.
      cold_replay_size: the items on disk; 0: the rest of max_replay_size.
      demo_fraction: the share of every learner batch drawn from demonstrations
        (`--demos`, docs/demonstrations.md); 0 (the default): none.
      demo_margin_weight: lambda of DQfD's large-margin loss on demonstration rows
        (Hester et al., 2018), max_a [Q(s, a) + margin * (a != a_E)] - Q(s, a_E), added to
        the TD loss; 0 (the default): off, demonstrations are only replayed.
      demo_margin: the margin by which the demonstrated action must lead the others.
      epsilon_start: exploration epsilon at an actor's first env step.
      epsilon_end: epsilon after `epsilon_decay_steps` env steps of that actor.
      epsilon_decay_steps: env steps of one actor over which epsilon falls linearly.
      epsilon_end_spread: actor i of N ends at epsilon_end * (1 - spread * i / (N - 1)),
        so actors explore by different amounts (0 gives all actors the same epsilon).
      eval_epsilon: epsilon of the greedy evaluation policy.
    """

    torso: str = "auto"
    hidden_sizes: tuple[int, ...] = (512,)
    dueling: bool = True
    layer_norm: bool = False
    discount: float = 0.99
    n_step: int = 3
    learning_rate: float = 2.5e-4
    learning_rate_decay_steps: int = 1_000_000
    learning_rate_final_fraction: float = 0.0
    adam_eps: float = 1.5e-4
    adam_b1: float = 0.9
    max_grad_norm: float = 2.5
    clip_mode: str = "global"
    layer_grad_norm: float = 1.0
    precision: str = "fp32"
    loss_scale_init: float = 256.0
    loss_scale_period: int = 2000
    actor_params_dtype: str = "float32"
    replay_obs_dtype: str = "float32"
    huber_delta: float = 1.0
    batch_size: int = 512
    batch_size_max: int = 0
    batch_growth_steps: int = 500_000
    target_update_period: int = 5000
    samples_per_insert: float = 8.0
    updates_per_dispatch: int = 1
    min_replay_size: int = 20_000
    max_replay_size: int = 1_000_000
    priority_exponent: float = 0.6
    importance_exponent_start: float = 0.4
    importance_exponent_anneal_steps: int = 1_000_000
    priority_epsilon: float = 1e-6
    initial_priority: float = 1.0
    hot_replay_size: int = 0
    cold_replay_size: int = 0
    priority_duplicate_bonus: float = 0.0
    demo_fraction: float = 0.0
    demo_margin_weight: float = 0.0
    demo_margin: float = 0.8
    epsilon_start: float = 1.0
    epsilon_end: float = 0.1
    epsilon_decay_steps: int = 1_000_000
    epsilon_end_spread: float = 0.0
    eval_epsilon: float = 0.001

    def budget_schedules(self) -> dict[str, str]:
        """Schedules whose length follows the run's budget (launch/schedules.py), by unit:
        "updates" (learner steps) or "actor_env_steps" (env steps of one actor)."""
        schedules = {
            "learning_rate_decay_steps": "updates",
            "importance_exponent_anneal_steps": "updates",
            "epsilon_decay_steps": "actor_env_steps",
        }
        if self.batch_size_max:  # batch growth is on
            schedules["batch_growth_steps"] = "updates"
        return schedules

    def updates_per_env_step(self) -> float:
        """Learner steps per env step at the replay ratio the rate limiter holds."""
        return self.samples_per_insert / self.batch_size

    @property
    def replay_tiers(self) -> tuple[int, int] | None:
        """(hot, cold) items of a tiered replay; None: all in memory."""
        return config_checks.replay_tiers(
            self.hot_replay_size, self.cold_replay_size, self.max_replay_size, self.min_replay_size
        )

    def validate(self, num_devices: int) -> None:
        """Raises ValueError naming the first field whose value cannot work."""
        config_checks.check_fields(
            self,
            prefix="config.",
            choices=CHOICES,
            positive=_POSITIVE,
            non_negative=("priority_duplicate_bonus", "demo_margin_weight", "demo_margin"),
            unit_interval=_UNIT_INTERVAL,
        )
        config_checks.check_demo_fraction(self.demo_fraction, self.batch_size)
        self.replay_tiers  # noqa: B018  raises ValueError for bad tier sizes
        if self.demo_margin_weight and not self.demo_fraction:
            raise ValueError(
                "config.demo_margin_weight > 0 needs demonstrations: set config.demo_fraction "
                "(and --demos)"
            )
        if not 0.0 <= self.adam_b1 < 1.0:
            # b1 = 1 never lets a new gradient in (and divides by zero in Adam's bias correction).
            raise ValueError(f"config.adam_b1 must lie in [0, 1), got {self.adam_b1}")
        if any(size <= 0 for size in self.hidden_sizes):
            raise ValueError(f"config.hidden_sizes must be positive, got {self.hidden_sizes}")
        if self.precision == "fp16" and self.loss_scale_init < 1:
            raise ValueError(
                f"config.loss_scale_init must be >= 1 for fp16, got {self.loss_scale_init}"
            )
        if self.min_replay_size > self.max_replay_size:
            raise ValueError(
                f"config.min_replay_size={self.min_replay_size} exceeds "
                f"config.max_replay_size={self.max_replay_size}"
            )
        batch_name = "batch_size_max" if self.batch_size_max > self.batch_size else "batch_size"
        if getattr(self, batch_name) > self.max_replay_size:
            # Sampling draws with replacement, so it would run, on duplicates alone.
            raise ValueError(
                f"config.{batch_name}={getattr(self, batch_name)} exceeds "
                f"config.max_replay_size={self.max_replay_size}: a batch larger than the replay"
            )
        for name in ("batch_size", "batch_size_max"):
            if getattr(self, name) % num_devices:
                raise ValueError(
                    f"config.{name}={getattr(self, name)} must be divisible by the "
                    f"{num_devices} learner devices"
                )
        if self.batch_size_max and self.batch_size_max < self.batch_size:
            raise ValueError(
                f"config.batch_size_max={self.batch_size_max} is below "
                f"config.batch_size={self.batch_size} (0 keeps the batch fixed)"
            )
