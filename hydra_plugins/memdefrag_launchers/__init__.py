"""memdefrag's hydra/launcher plugins (Hydra takes launchers only from the hydra_plugins package): the
submitit launchers with harness.running.slurm's preflight, status lines and failure reports."""

from dataclasses import dataclass
from typing import Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf

from harness.running.slurm import Local, Slurm


class SlurmLauncher(Slurm, submitit_launcher.SlurmLauncher):
    """hydra/launcher=slurm (conf/hydra/launcher/slurm.yaml)."""


class LocalLauncher(Local, submitit_launcher.LocalLauncher):
    """hydra/launcher=local (conf/hydra/launcher/local.yaml)."""


@dataclass
class LocalConf(LocalQueueConf):
    """submitit_local's settings and the local launcher's own (harness.running.slurm.Local)."""
    _target_: str = "hydra_plugins.memdefrag_launchers.LocalLauncher"
    gpus_per_node: Optional[int] = None     # null: the GPUs this command sees, none for a CPU model
    array_parallelism: int = 1              # jobs running at once


ConfigStore.instance().store(group="hydra/launcher", name="local_schema", node=LocalConf(), provider="memdefrag")
