"""pepsi.conf: reading, value types, the option schema and loading.

- :mod:`.ini` reads a GNUnet-style INI file (no knowledge of pepsi's options);
- :mod:`.values` converts and bounds option values;
- :mod:`.model` is the loaded configuration's shape;
- :mod:`.load` knows the sections and options, the search order and the
  database overlay, and builds a :class:`Config`.
"""

from pepsi_dispatch.config.ini import ConfigError
from pepsi_dispatch.config.load import (
    DEFAULT_DSN,
    OVERLAY_ORIGIN,
    SYSTEM_CONFIG,
    apply_overlay,
    find_config,
    load_config,
    reread_config,
)
from pepsi_dispatch.config.model import Config, DispatchConfig, StageConfig
from pepsi_dispatch.config.schedule import ScheduleConfig
from pepsi_dispatch.config.values import parse_bool, parse_duration, parse_time

__all__ = [
    "DEFAULT_DSN",
    "OVERLAY_ORIGIN",
    "SYSTEM_CONFIG",
    "Config",
    "ConfigError",
    "DispatchConfig",
    "ScheduleConfig",
    "StageConfig",
    "apply_overlay",
    "find_config",
    "load_config",
    "parse_bool",
    "parse_duration",
    "parse_time",
    "reread_config",
]
