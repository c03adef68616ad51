"""The loaded configuration's shape: one frozen dataclass per kind of section."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pepsi_dispatch.config.schedule import ScheduleConfig
from pepsi_dispatch.contract import DEFAULT_MAX_RETRIES


@dataclass(frozen=True)
class StageConfig:
    """One ``[stage-NAME]`` section."""

    name: str
    program: str
    next: tuple[str, ...]
    parallelism: int = 4
    queue_limit: int = 4
    max_messages: int = 1000
    #: MIN_WORKERS: workers kept started while the stage is idle (0 = on demand only);
    #: at most ``parallelism``.
    min_workers: int = 0
    max_retries: int = DEFAULT_MAX_RETRIES
    #: PAUSED (an overlay option the dashboard sets): claim nothing for this stage.
    paused: bool = False
    #: Automatic retries (seconds; None = off): a failure the dispatcher sees is
    #: paused for retry_delay x 2^retries, capped by retry_delay_max, with jitter.
    retry_delay: float | None = None
    retry_delay_max: float | None = None
    worker_dsn: str | None = None  # WORKER_DSN: PEPSI_DSN of its workers (None: global)


@dataclass(frozen=True)
class DispatchConfig:
    """The ``[pepsi-dispatch]`` section; times in seconds."""

    max_runtime: float = 300.0
    worker_idle_timeout: float = 5.0
    poll_interval: float = 30.0
    stats_interval: float = 60.0
    db_pool_size: int = 8
    config_file: str | None = None
    service_user: str = "pepsi"
    shutdown_timeout: float = 10.0
    expiry: float = 86400.0
    competing: bool = False
    orphan_timeout: float = 300.0
    retention: float = 7 * 86400.0  # 0 = keep done rows
    worker_dsn: str | None = None  # WORKER_DSN: PEPSI_DSN of workers (None: the DSN)
    log_format: str = "text"  # LOG_FORMAT: text | json


@dataclass(frozen=True)
class Config:
    """A loaded, validated configuration."""

    path: Path | None  # file loaded (None = built-in defaults)
    dsn: str  # PEPSI_DSN env > [database] DSN > postgresql:///pepsi
    dispatch: DispatchConfig
    stages: dict[str, StageConfig]  # validated graph, in file order
    sections: dict[str, dict[str, str]]  # expanded values; lower-case sections, upper-case keys
    #: Extension: where each value came from, (section, OPTION) -> "FILE:LINE" or
    #: OVERLAY_ORIGIN; (section, "") is the section header.
    origins: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False)
    #: ``[schedule-NAME]`` sections, by name, in file order (overlay ones after).
    schedules: dict[str, ScheduleConfig] = field(default_factory=dict)
