"""PPO hyperparameters. Defaults follow Schulman et al. (2017) and CleanRL's Atari PPO."""

import dataclasses

from agents.dqn.networks import TORSOS
from gorila_jax import config_checks

CHOICES = {
    "torso": ("auto", *TORSOS),
    "activation": ("tanh", "relu"),
    "precision": ("fp32", "bf16"),
}


@dataclasses.dataclass
class PPOConfig:
    """Clipped-surrogate PPO on trajectory chunks, with V-trace corrections for policy lag.

    Actors write chunks of `trajectory_length` steps per env to a queue table
    (each chunk is learned from once). A learner step takes `global_batch_size`
    chunks, computes advantages once, then runs `num_epochs` passes of
    `num_minibatches` minibatches over them.

    Attributes:
      torso: "mlp" (vector observations: separate policy and value MLPs),
        "nature" or "impala" (uint8 image stacks) or "minatar" ([H, W, C] grids): one
        conv torso shared by both heads; or "auto": nature for image stacks, minatar for
        grids, else mlp.
      hidden_sizes: widths of each MLP (or of the layers after a conv torso).
      activation: the MLP's nonlinearity (conv torsos use ReLU).
      init_log_std: initial log standard deviation of the Gaussian policy
        (continuous actions; a learned, state-independent parameter).
      discount: per-step discount gamma.
      gae_lambda: lambda of GAE (Schulman et al., 2016) and of the V-trace targets.
      trajectory_length: steps per chunk (T); chunks of one env follow each other.
      batch_size: chunks per learner step on a single machine: with
        `scale_batch_with_actors`, the learner takes this many chunks per actor.
      scale_batch_with_actors: the brief's rule "batch size = single-machine
        batch x number of workers": the global batch is `batch_size * num_actors`
        chunks, so each update sees as many steps per actor whatever the actor count.
      num_actors: the experiment's actor count (`--num_actors`); sizes the
        per-actor KL report and the scaled batch. Actors refuse to start when
        the experiment runs a different number.
      num_epochs: passes over each batch.
      num_minibatches: minibatches per pass; every learner device splits its
        share of the batch's steps into this many.
      learning_rate: Adam step size.
      learning_rate_decay_updates: learner steps over which the step size falls
        linearly to 0; 0 keeps it constant.
      adam_eps: Adam's epsilon.
      max_grad_norm: global-norm clip of each minibatch gradient.
      clip_epsilon: the surrogate's ratio clip (epsilon of Schulman et al., 2017).
      value_clip_epsilon: the value prediction may move at most this far from
        its value at the start of the learner step; 0 disables value clipping.
      value_coef: weight of the value loss.
      entropy_coef: weight of the entropy bonus.
      normalize_advantages: standardize advantages per minibatch (over all devices).
      rho_bar: truncation of the importance weights in the V-trace TD errors
        and in the policy-gradient advantages (Espeholt et al., 2018).
      c_bar: truncation of the V-trace trace-cutting coefficients.
      kl_target: stop the learner step's epochs once the approximate KL between
        the policy at the step's start and the current one exceeds 1.5 x this
        (checked before each minibatch update); 0 runs every epoch.
      normalize_observations: standardize observations by running statistics
        kept by the learner and sent to actors with the parameters (useful for
        continuous control, whose observation scales differ by orders of magnitude).
      observation_clip: normalized observations are clipped to +-this.
      reward_scale: rewards are multiplied by this before the learner's value targets
        and advantages (Brax PPO's `reward_scaling`). Advantages are standardized per
        minibatch anyway; what it changes is the value loss's scale, and with it how
        much of each minibatch's clipped gradient norm the value network takes. Returns
        that the console, metrics and evaluations report stay unscaled.
      queue_batches: the trajectory queue holds this many learner batches.
        A full queue blocks actors, so they run at most about this many
        parameter versions ahead of the learner, plus the batches the learner
        prefetches (reported as the metric policy_lag_max).
      precision: "fp32", or "bf16" (bfloat16 activations and matmuls, float32
        parameters, optimizer state and losses).
    """

    torso: str = "auto"
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0
    discount: float = 0.99
    gae_lambda: float = 0.95
    trajectory_length: int = 128
    batch_size: int = 8
    scale_batch_with_actors: bool = True
    num_actors: int = 2
    num_epochs: int = 4
    num_minibatches: int = 4
    learning_rate: float = 2.5e-4
    learning_rate_decay_updates: int = 0
    adam_eps: float = 1e-5
    max_grad_norm: float = 0.5
    clip_epsilon: float = 0.1
    value_clip_epsilon: float = 0.1
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    normalize_advantages: bool = True
    rho_bar: float = 1.0
    c_bar: float = 1.0
    kl_target: float = 0.0
    normalize_observations: bool = False
    observation_clip: float = 10.0
    reward_scale: float = 1.0
    queue_batches: int = 2
    precision: str = "fp32"

    @property
    def global_batch_size(self) -> int:
        """Chunks per learner step, over all learner devices."""
        return self.batch_size * (self.num_actors if self.scale_batch_with_actors else 1)

    def budget_schedules(self) -> dict[str, str]:
        """Schedules whose length follows the run's budget (launch/schedules.py), by unit."""
        return {"learning_rate_decay_updates": "updates"}

    def updates_per_env_step(self) -> float:
        """Learner steps per env step: one per global batch of chunks."""
        return 1.0 / (self.global_batch_size * self.trajectory_length)

    def validate(self, num_devices: int) -> None:
        """Raises ValueError naming the first field whose value cannot work."""
        config_checks.check_fields(
            self,
            prefix="config.",
            choices=CHOICES,
            positive=(
                "trajectory_length",
                "batch_size",
                "num_actors",
                "num_epochs",
                "num_minibatches",
                "learning_rate",
                "adam_eps",
                "max_grad_norm",
                "clip_epsilon",
                "rho_bar",
                "c_bar",
                "observation_clip",
                "reward_scale",
                "queue_batches",
            ),
            non_negative=(
                "learning_rate_decay_updates",
                "value_clip_epsilon",
                "value_coef",
                "entropy_coef",
                "kl_target",
            ),
            unit_interval=("discount", "gae_lambda"),
        )
        if not self.hidden_sizes or any(size <= 0 for size in self.hidden_sizes):
            raise ValueError(f"config.hidden_sizes must be positive, got {self.hidden_sizes}")
        batch = self.global_batch_size
        if batch % num_devices:
            scaled = f" x config.num_actors={self.num_actors}"
            raise ValueError(
                f"the global batch of {batch} chunks (config.batch_size={self.batch_size}"
                f"{scaled if self.scale_batch_with_actors else ''}) must be divisible by "
                f"the {num_devices} learner devices"
            )
        steps_per_device = batch // num_devices * self.trajectory_length
        if steps_per_device % self.num_minibatches:
            raise ValueError(
                f"config.num_minibatches={self.num_minibatches} must divide the "
                f"{steps_per_device} steps each of the {num_devices} learner devices gets "
                f"({batch // num_devices} chunks x config.trajectory_length="
                f"{self.trajectory_length})"
            )
