"""memdefrag's hydra/launcher plugins (Hydra takes launchers only from the hydra_plugins package): the
submitit launchers with harness.running.slurm's preflight, status lines and failure reports."""

from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from harness.running.slurm import Local, Slurm


class SlurmLauncher(Slurm, submitit_launcher.SlurmLauncher):
    """hydra/launcher=slurm (conf/hydra/launcher/slurm.yaml)."""


class LocalLauncher(Local, submitit_launcher.LocalLauncher):
    """hydra/launcher=local (conf/hydra/launcher/local.yaml)."""
