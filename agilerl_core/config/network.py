"""The networks of an RL experiment's members (gym, offline and multi-agent kinds): the MLP head, the conv
encoder of image observations, the per-key encoders of a Dict observation and the optional recurrent core,
with the bounds their architecture mutations respect."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agilerl_core.config.common import _Strict

ACTIVATIONS = ("relu", "leaky_relu", "elu", "tanh")


class CNNConfig(_Strict):
    """Convolutional encoder for image observations (used only when the observation has images).

    With neither `kernel_sizes` nor `strides` given, the conv stack is chosen from each image's frame size
    (:func:`agilerl_core.networks.cnn.default_conv_layers`: Atari's 8/4/3 kernels with strides 4/2/1 for
    frames of 36 px or more, smaller kernels with stride 1 for grid views); `channels`, if given, then sets
    the widths of its first len(channels) layers. Giving either one makes the stack explicit: the other
    fields left out take the Atari values (32/64/64, 8/4/3, 4/2/1), as they always have."""

    channels: list[int] | None = Field(None, min_length=1, description="Output channels per conv layer "
                                                                       "(None: 32, 64, 64, one per layer).")
    kernel_sizes: list[int] | None = Field(None, min_length=1, description="Kernel size per conv layer (None, with "
                                                                           "strides None: chosen from the frame size).")
    strides: list[int] | None = Field(None, min_length=1, description="Stride per conv layer (None, with "
                                                                      "kernel_sizes None: chosen from the frame size).")
    input_scale: Literal["auto", "pixels", "bounds", "none"] = Field(
        "auto", description="How images become network input: auto picks from the space (uint8 0-255: / 255; an "
                            "integer Box spanning at most 32 values, e.g. object codes: (x - low) / (high - low) "
                            "per channel; floats: as they are), except that a uint8 0-255 image whose env shows no "
                            "value above 32 in a seeded probe (codes declared as pixels) is divided per channel by "
                            "the highest value it showed; pixels, bounds or none force one (and skip the probe).")
    latent_dim: int = Field(128, ge=1, description="Width of the linear projection after the convs.")
    min_layers: int = Field(1, ge=1, description="Fewest conv layers a mutation may leave.")
    max_layers: int = Field(4, ge=1, description="Most conv layers a mutation may create.")
    min_channels: int = Field(8, ge=1, description="Fewest channels a conv layer may have.")
    max_channels: int = Field(256, ge=1, description="Most channels a conv layer may have.")
    kernel_choices: list[int] = Field([3, 4, 5, 8], min_length=1, description="Kernel sizes a mutation may pick.")
    channel_changes: list[int] = Field([8, 16, 32], min_length=1, description="Channel counts a mutation adds/removes.")
    channels_last: bool | None = Field(None, description="Image layout; None detects HWC vs CHW from the shape.")

    @model_validator(mode="before")
    @classmethod
    def _explicit_stack(cls, data: Any) -> Any:
        """An explicit stack (kernel_sizes or strides given) fills the fields left out with the Atari values,
        as before frame-sized defaults existed, so every existing config builds the encoder it always built."""
        if isinstance(data, dict) and (data.get("kernel_sizes") is not None or data.get("strides") is not None):
            atari = {"channels": [32, 64, 64], "kernel_sizes": [8, 4, 3], "strides": [4, 2, 1]}
            data = {**data, **{k: v for k, v in atari.items() if data.get(k) is None}}
        return data

    @property
    def explicit(self) -> bool:
        """Whether the config fixes the conv stack (else it is chosen from the frame size)."""
        return self.kernel_sizes is not None

    @model_validator(mode="after")
    def _lengths(self) -> CNNConfig:
        if self.explicit and not (len(self.channels) == len(self.kernel_sizes) == len(self.strides)):
            raise ValueError("channels, kernel_sizes and strides must have the same length")
        if self.channels is not None and not self.min_layers <= len(self.channels) <= self.max_layers:
            raise ValueError(f"the number of conv layers must lie in [min_layers, max_layers] = "
                             f"[{self.min_layers}, {self.max_layers}]")
        return self


class VectorEncoderConfig(_Strict):
    """Per-key encoders of a Dict observation's vector and Discrete keys (unused for other spaces)."""

    per_key: bool = Field(True, description="Give each vector key of a Dict observation its own MLP encoder "
                                            "feeding the head; false concatenates the keys into one flat input.")
    hidden_sizes: list[int] = Field([64], description="Hidden widths of each key's encoder (may be empty: one "
                                                      "linear layer).")
    latent_dim: int = Field(32, ge=1, description="Output width of each key's encoder.")


class RNNConfig(_Strict):
    """A recurrent core (LSTM or GRU) between the observation features and the MLP head: the policy
    remembers what it saw in the episode (partially observed envs). PPO only; trained by truncated
    backpropagation through time over ``hyperparameters.seq_len`` steps. Its hidden size mutates within
    ``min_nodes``/``max_nodes`` by ``node_changes``, its layers within [1, max_layers]."""

    cell: Literal["lstm", "gru"] = Field("lstm", description="Recurrent cell kind.")
    hidden_size: int = Field(64, ge=1, description="Units of each recurrent layer.")
    num_layers: int = Field(1, ge=1, description="Stacked recurrent layers.")
    max_layers: int = Field(2, ge=1, description="Most recurrent layers a mutation may create.")

    @model_validator(mode="after")
    def _layers(self) -> RNNConfig:
        if self.num_layers > self.max_layers:
            raise ValueError(f"num_layers = {self.num_layers} exceeds max_layers = {self.max_layers}")
        return self


class NetworkConfig(_Strict):
    """Architecture of every network and the bounds its mutations respect."""

    hidden_sizes: list[int] = Field([64, 64], min_length=1, description="Width of each hidden MLP layer.")
    activation: Literal[ACTIVATIONS] = Field("relu", description="Hidden activation.")
    min_hidden_layers: int = Field(1, ge=1, description="Fewest hidden layers a mutation may leave.")
    max_hidden_layers: int = Field(4, ge=1, description="Most hidden layers a mutation may create.")
    min_nodes: int = Field(16, ge=1, description="Fewest units a hidden layer may have.")
    max_nodes: int = Field(512, ge=1, description="Most units a hidden layer may have.")
    node_changes: list[int] = Field([16, 32, 64], min_length=1, description="Unit counts a node mutation adds/removes.")
    activation_choices: list[Literal[ACTIVATIONS]] = Field(list(ACTIVATIONS), min_length=1,
                                                           description="Activations a mutation may pick.")
    cnn: CNNConfig = Field(default_factory=CNNConfig, description="Conv encoder for image observations.")
    vector_encoder: VectorEncoderConfig = Field(default_factory=VectorEncoderConfig,
                                                description="Encoders of a Dict observation's vector keys.")
    rnn: RNNConfig | None = Field(None, description="A recurrent core (LSTM/GRU) before the head; PPO only "
                                                    "(None: feed-forward).")

    @model_validator(mode="after")
    def _bounds(self) -> NetworkConfig:
        if not self.min_hidden_layers <= len(self.hidden_sizes) <= self.max_hidden_layers:
            raise ValueError(f"len(hidden_sizes) = {len(self.hidden_sizes)} must lie in [min_hidden_layers, "
                             f"max_hidden_layers] = [{self.min_hidden_layers}, {self.max_hidden_layers}]")
        for name, sizes in (("hidden_sizes", self.hidden_sizes),
                            ("vector_encoder.hidden_sizes", self.vector_encoder.hidden_sizes),
                            ("rnn.hidden_size", [self.rnn.hidden_size] if self.rnn else [])):
            bad = [h for h in sizes if not self.min_nodes <= h <= self.max_nodes]
            if bad:
                raise ValueError(f"{name} {bad} outside [min_nodes, max_nodes] = "
                                 f"[{self.min_nodes}, {self.max_nodes}]")
        return self
