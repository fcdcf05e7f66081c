"""The library in one import: `from memdefrag import load, ModelSpec, Session, MemDefrag, ...`.

Loading a model (`ModelSpec`, `load`), the memory store (`LatentMemory`, `Fragment`), the session that
stores and asks (`Session`), the methods (`MemDefrag`, `Vanilla`, `NoMemory`, `TextMemory`), the backends
(`KVPrefixBackend`, the fast one; `HiddenPrefixBackend`, the paper's formulation) and forgetting within a
capacity (`Informativeness`, `RandomForgetting`, `RandomLayerwise`), and the model's trained window every read
is counted against (`Window`, `WindowError`)."""

from harness.models.loading import ModelSpec, load
from methods.forgetting import Informativeness, RandomForgetting, RandomLayerwise
from methods.backends.hidden_prefix import HiddenPrefixBackend
from methods.backends.kv_prefix import KVPrefixBackend
from methods.memdefrag import MemDefrag
from methods.memory import Fragment, LatentMemory
from methods.baselines import NoMemory
from methods.session import Session
from methods.baselines import TextMemory
from methods.baselines import Vanilla
from methods.window import Window, WindowError

__all__ = ["Fragment", "HiddenPrefixBackend", "Informativeness", "KVPrefixBackend", "LatentMemory", "MemDefrag",
           "ModelSpec", "NoMemory", "RandomForgetting", "RandomLayerwise", "Session", "TextMemory", "Vanilla", "Window",
           "WindowError", "load"]
