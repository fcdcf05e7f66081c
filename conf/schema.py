"""Typed schemas of every config group, registered in Hydra's ConfigStore.

The YAML files stay what users read; each extends its schema (`defaults: [<schema>, _self_]`,
the schema stored in the same group), and the top-level config extends `RunSchema`, which
types the model too. So Hydra refuses a wrong type, an unknown choice or an unknown key on
the command line with the key, the value and what is allowed, before any code of ours runs.
Ranges (k >= 1, a layer within the model) are checked by the plugins, before any weights load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, SI


Backend = StrEnum("Backend", ["fast", "hidden_prefix"])
Formation = StrEnum("Formation", ["shared_sink", "reference"])
Prompt = StrEnum("Prompt", ["chat", "plain"])
QueryMode = StrEnum("QueryMode", ["last", "mean"])
Dtype = StrEnum("Dtype", ["float32", "bfloat16", "float16"])
Dataset = StrEnum("Dataset", ["synthetic", "nqa", "squad"])
LongBenchDataset = StrEnum("LongBenchDataset", ["synthetic", "longbench"])
Overflow = StrEnum("Overflow", ["skip", "truncate"])
Chunking = StrEnum("Chunking", ["passages", "sentences", "fixed"])
LongBenchPrompt = StrEnum("LongBenchPrompt", ["plain", "longbench", "chat"])
WandbMode = StrEnum("WandbMode", ["offline", "online", "disabled"])


@dataclass
class ModelSchema:
    name: str = MISSING
    source: str = MISSING
    gguf_file: Optional[str] = None
    dtype: Dtype = Dtype.float32
    device: str = "auto"
    device_map: Optional[str] = None
    tracer_layer: Optional[int] = None
    query_mode: Optional[QueryMode] = None
    prompt: Prompt = Prompt.chat
    trust_remote_code: bool = False
    memory_capacity: Optional[int] = None


@dataclass
class MethodSchema:
    _target_: str = MISSING
    label: str = MISSING


@dataclass
class MemDefragSchema(MethodSchema):
    k: Any = 2                              # an integer >= 1 or 'all': checked by MemDefrag
    tracer_layer: Optional[int] = None
    query_mode: Optional[QueryMode] = None


@dataclass
class MemoryLLMSchema(MethodSchema):
    defragment: bool = False
    tracer_layer: Optional[int] = None
    query_mode: Optional[QueryMode] = None
    seed: int = 0


@dataclass
class TaskSchema:
    _target_: str = MISSING
    dataset: Dataset = Dataset.synthetic
    data_dir: Optional[str] = None
    groups: int = 20
    seed: int = 42
    max_context_tokens: int = 512


@dataclass
class RetentionSchema(TaskSchema):
    updates: int = 20
    eval_steps: Optional[List[int]] = None
    shuffle: bool = True


@dataclass
class ProbeSchema(TaskSchema):
    fragments: int = 20
    positions: Optional[List[int]] = None
    one_position_per_group: bool = False
    layers: Any = "all"                     # 'all', 'band' or a list of layers: checked by Probe


@dataclass
class DistortionSchema(TaskSchema):
    updates: int = 20


@dataclass
class LongBenchSchema:
    _target_: str = MISSING
    dataset: LongBenchDataset = LongBenchDataset.synthetic
    data_dir: Optional[str] = None
    hub_id: Optional[str] = None
    subsets: Optional[List[str]] = None     # names checked by LongBench against the dataset's
    groups: Optional[int] = None
    max_tokens: int = 16_384
    overflow: Overflow = Overflow.skip
    chunking: Optional[Chunking] = None
    chunk_tokens: int = 256
    prompt: LongBenchPrompt = LongBenchPrompt.plain
    max_new_tokens: Optional[int] = None
    seed: int = 42
    bertscore_model: str = "minilm"
    bertscore_layers: Optional[int] = None
    bertscore_rescale: bool = False


@dataclass
class ForgettingSchema:
    _target_: str = MISSING
    label: str = MISSING


@dataclass
class CapacitySchema(ForgettingSchema):
    capacity: Optional[int] = None
    seed: int = 0


@dataclass
class CompressionSchema:
    _target_: str = MISSING
    label: str = MISSING


@dataclass
class RateSchema(CompressionSchema):
    rate: float = 1.0                       # the share of a fragment's tokens kept, in (0, 1]


@dataclass
class LLMLinguaSchema(RateSchema):
    model: Optional[str] = None             # a hub id or local folder
    device: str = "cpu"


@dataclass
class IterativeSchema(RateSchema):
    model: Optional[str] = None             # a local causal LM; null = the run's own model
    segment_tokens: int = 50                # the iteration window


@dataclass
class NullLoggerSchema:
    _target_: str = MISSING


@dataclass
class WandbSchema(NullLoggerSchema):
    mode: WandbMode = WandbMode.offline
    project: str = "memdefrag"
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class RunSchema:
    model: ModelSchema = MISSING
    method: Any = MISSING
    task: Any = MISSING
    forgetting: Any = MISSING
    compression: Any = MISSING
    logger: Any = MISSING
    backend: Backend = Backend.fast
    formation: Formation = Formation.shared_sink
    prompt: Prompt = SI("${model.prompt}")
    max_new_tokens: int = 32
    threads: Optional[int] = None
    seed: int = 0
    shard: Optional[str] = None
    resume: bool = True
    study: Optional[str] = None             # the experiment a run belongs to, where its tables need to know


SCHEMAS = {
    (None, "run_schema"): RunSchema,
    ("method", "method_schema"): MethodSchema,
    ("method", "memdefrag_schema"): MemDefragSchema,
    ("method", "memoryllm_schema"): MemoryLLMSchema,
    ("task", "retention_schema"): RetentionSchema,
    ("task", "probe_schema"): ProbeSchema,
    ("task", "distortion_schema"): DistortionSchema,
    ("task", "longbench_schema"): LongBenchSchema,
    ("forgetting", "forgetting_schema"): ForgettingSchema,
    ("forgetting", "capacity_schema"): CapacitySchema,
    ("compression", "compression_schema"): CompressionSchema,
    ("compression", "rate_schema"): RateSchema,
    ("compression", "llmlingua_schema"): LLMLinguaSchema,
    ("compression", "iterative_schema"): IterativeSchema,
    ("logger", "null_logger_schema"): NullLoggerSchema,
    ("logger", "wandb_schema"): WandbSchema,
}


def register() -> None:
    store = ConfigStore.instance()
    for (group, name), node in SCHEMAS.items():
        store.store(group=group, name=name, node=node)
