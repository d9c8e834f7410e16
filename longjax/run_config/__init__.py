"""The run config, typed and frozen (:class:`RunConfig`), built once by :func:`from_config` at the
entry points; its sections and their defaults (``sections``, ``eval_sections``)."""
from longjax.run_config.build import ConfigError, RunConfig, from_config, stored_config, to_dict
from longjax.run_config.eval_sections import EvalSection, eval_defaults
from longjax.run_config.sections import (BeaconSection, DataSection, DistillSettings,
                                         FocusSection, ModelSection, PretrainSection,
                                         SyntheticSection, TrainSection)

__all__ = ["ConfigError", "RunConfig", "from_config", "stored_config", "to_dict", "EvalSection",
           "eval_defaults", "BeaconSection", "DataSection", "DistillSettings", "FocusSection",
           "ModelSection", "PretrainSection", "SyntheticSection", "TrainSection"]
