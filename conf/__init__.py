"""The shipped configs; importing the package registers their typed schemas with Hydra, and has OmegaConf parse
YAML on libyaml's C parser under its own rules (harness.results.folder.ConfigLoader): Hydra reads every config file
of a composition afresh at each compose, and the pure-Python parser took a fifth of a sweep's preflight."""

import functools

import omegaconf._utils

from conf.schema import register
from harness.results.folder import ConfigLoader


@functools.wraps(omegaconf._utils.get_yaml_loader)          # __wrapped__: OmegaConf's own, for inspect.unwrap
def c_parsed_loader():
    return ConfigLoader


omegaconf._utils.get_yaml_loader = c_parsed_loader   # read at each OmegaConf.load and create from a string
register()
