"""The three specs every part of ptd shares: the model, the hardware, the parallel plan.

Plain dataclasses with presets and one-line validation errors. No torch here: the cost
model and the planner run anywhere, instantly.
"""

from .config import CheckpointConfig, DataConfig, OptimConfig, TrainConfig, config_from_dict, load_config
from .hardware import (ClusterSpec, CollectiveFit, HardwareSpec, LinkSpec, get_hardware_preset,
                       load_hardware)
from .hardware import PRESETS as HARDWARE_PRESETS
from .model import ModelSpec, get_preset, load_model
from .model import PRESETS as MODEL_PRESETS
from .plan import ParallelPlan, plan_from_dict

__all__ = [
    "CheckpointConfig", "ClusterSpec", "CollectiveFit", "DataConfig", "HARDWARE_PRESETS",
    "HardwareSpec", "LinkSpec", "MODEL_PRESETS", "ModelSpec", "OptimConfig", "ParallelPlan",
    "TrainConfig", "config_from_dict", "get_hardware_preset", "get_preset", "load_config",
    "load_hardware", "load_model", "plan_from_dict",
]
