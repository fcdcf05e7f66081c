"""The shipped configs; importing the package registers their typed schemas with Hydra."""

from conf.schema import register

register()
