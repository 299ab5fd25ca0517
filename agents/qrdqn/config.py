"""QR-DQN hyperparameters: DQN's, plus the number of quantiles."""

import dataclasses

from agents.dqn import config as dqn_config


@dataclasses.dataclass
class QRDQNConfig(dqn_config.DQNConfig):
    """QR-DQN on DQN's replay, n-step returns, PER, Adam and epsilon schedule.

    Every DQN field means what it does there (`agents.dqn.config.DQNConfig`),
    with two readings specific to QR-DQN:
      huber_delta: kappa of the quantile Huber loss (Dabney et al., 2018, eq. 10).
      dueling: the value and advantage streams each output a quantile per action.

    Attributes:
      num_quantiles: N, the quantiles the head outputs per action, at the
        midpoints tau_i = (2i + 1) / 2N. The loss compares all N x N pairs
        of predicted and target quantiles, so its cost grows as N squared;
        51 is plenty for CartPole's returns (the paper used 200 on Atari).
    """

    num_quantiles: int = 51

    def validate(self, num_devices: int) -> None:
        """Raises ValueError naming the first field whose value cannot work."""
        super().validate(num_devices)
        if self.num_quantiles < 1:
            raise ValueError(f"config.num_quantiles must be >= 1, got {self.num_quantiles}")
        if self.huber_delta <= 0:
            # kappa divides the loss (eq. 10); kappa -> 0 is the plain quantile loss.
            raise ValueError(f"config.huber_delta must be positive, got {self.huber_delta}")
