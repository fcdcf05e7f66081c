"""The shipped configs; importing the package registers their typed schemas with Hydra, and has OmegaConf parse
YAML on libyaml's C parser under its own rules (harness.results.folder.ConfigLoader): Hydra reads every config file
of a composition afresh at each compose, and the pure-Python parser took a fifth of a sweep's preflight."""

import omegaconf._utils

from conf.schema import register
from harness.results.folder import ConfigLoader

omegaconf._utils.get_yaml_loader = lambda: ConfigLoader   # read at each OmegaConf.load / create from a string
register()
