"""tf_adabatch: adaptive batch sizes (SimiGrad) and AdaScale learning rates for tf.distribute.

The public API, in one place:

>>> import tf_adabatch
>>> "Trainer" in tf_adabatch.__all__ and "attach" in tf_adabatch.__all__
True
"""

import os as _os

if "TF_CPP_MIN_LOG_LEVEL" in _os.environ:
    # TensorFlow prints some C++ start-up lines before it reads the level, twice; honour it.
    from tf_adabatch._quiet_import import import_tensorflow_quietly as _quiet

    _quiet()

from tf_adabatch import stats
from tf_adabatch.callbacks import AdaBatchTensorBoard, ProgressBudget
from tf_adabatch.clock import StepTimeModel, VirtualClock, WallClock
from tf_adabatch.critical_batch import CriticalBatchWarmupPolicy, NormTestPolicy, SeesawPolicy
from tf_adabatch.engine import AdaptiveEngine, NonFiniteGradientsError, NonFiniteUpdateError
from tf_adabatch.keras_fit import attach, load_model
from tf_adabatch.lr_callbacks import LearningRateScheduler, ReduceLROnPlateau
from tf_adabatch.options import EngineOptions
from tf_adabatch.policies import (
    BatchPolicy,
    GoodputPolicy,
    NoiseScalePolicy,
    SchedulePolicy,
    SimiGradPolicy,
    StaticPolicy,
    StepStats,
)
from tf_adabatch.probing import ProbingGoodputPolicy
from tf_adabatch.schedules import LR_RULES, AdaptiveLearningRate, LearningRateScale
from tf_adabatch.state import AdaptiveState
from tf_adabatch.throughput import ThroughputModel
from tf_adabatch.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "LR_RULES",
    "AdaBatchTensorBoard",
    "AdaptiveEngine",
    "AdaptiveLearningRate",
    "AdaptiveState",
    "BatchPolicy",
    "CriticalBatchWarmupPolicy",
    "EngineOptions",
    "GoodputPolicy",
    "LearningRateScale",
    "LearningRateScheduler",
    "NoiseScalePolicy",
    "NonFiniteGradientsError",
    "NonFiniteUpdateError",
    "NormTestPolicy",
    "ProbingGoodputPolicy",
    "ProgressBudget",
    "ReduceLROnPlateau",
    "SchedulePolicy",
    "SeesawPolicy",
    "SimiGradPolicy",
    "StaticPolicy",
    "StepStats",
    "StepTimeModel",
    "ThroughputModel",
    "Trainer",
    "VirtualClock",
    "WallClock",
    "attach",
    "load_model",
    "stats",
]
