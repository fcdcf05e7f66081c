"""Model sources: GGUF conversions are cached by content, not by file name; loading leaves the environment as it was."""

import os

import pytest
import torch

from harness.models.loading import content_key, converted_folder


def test_a_gguf_of_the_same_name_but_other_content_is_converted_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "cache"))
    first, second, copy = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf", tmp_path / "c" / "model.gguf"
    for path, content in ((first, b"weights one"), (second, b"weights two"), (copy, b"weights one")):
        path.parent.mkdir()
        path.write_bytes(content)
    assert converted_folder(first) != converted_folder(second)
    assert converted_folder(first) == converted_folder(copy)          # the same content: one conversion
    assert converted_folder(first).name.startswith("model-")


def test_a_changed_file_is_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"one")
    before = content_key(path)
    path.write_bytes(b"two, longer")
    assert content_key(path) != before


def test_a_library_error_is_shown_whole_on_one_line_without_dead_links():
    from harness.models.loading import one_line_cause

    err = OSError("Can't load tokenizer for '/data/m'. Make sure that it holds a tokenizer from one of:\n"
                  "- tokenizer.json\n- vocab.txt\n")
    assert one_line_cause(err) == ("Can't load tokenizer for '/data/m'. Make sure that it holds a tokenizer from "
                                   "one of: - tokenizer.json - vocab.txt")
    err = OSError("/data/m does not appear to have a file named x.gguf. Checkout 'https://huggingface.co//data/m/tree/"
                  "main' for available files.")
    assert one_line_cause(err) == "/data/m does not appear to have a file named x.gguf."
    assert one_line_cause(OSError("x" * 500)).endswith("...") and len(one_line_cause(OSError("x" * 500))) == 400


@pytest.mark.parametrize("how", ["load", "bench"])
def test_a_cpu_load_leaves_the_environment_as_it_was_and_still_groups_sdpa_heads_in_its_own_calls(
        how, tiny_checkpoint, monkeypatch):
    """transformers reads TRANSFORMERS_SDPA_FORCE_GQA at every attention call, process-wide: set by a CPU load, it
    would send every later CUDA model's masked attention to SDPA's math kernel. It is set only inside the CPU
    model's own attention calls."""
    from harness.models.shapes import build
    from harness.models.loading import SDPA_GROUPED, ModelSpec, load
    from methods.attention.decoder import attentions

    monkeypatch.delenv(SDPA_GROUPED, raising=False)
    before = dict(os.environ)
    model = load(ModelSpec("tiny", tiny_checkpoint, device="cpu"))[0] if how == "load" else build("tiny", "cpu",
                                                                                                  "float32")[0]
    assert dict(os.environ) == before
    seen = []
    attentions(model)[0].register_forward_pre_hook(lambda module, args: seen.append(os.environ.get(SDPA_GROUPED)))
    model(input_ids=torch.tensor([[1, 5, 7]]))
    assert seen == ["1"] and dict(os.environ) == before


def test_a_ggufs_metadata_is_read_once_for_config_and_tokenizer_and_each_caller_gets_its_own():
    """While _gguf_parsed_once is open, transformers' metadata-only reads of a file are one read, each caller
    getting a copy it may change; a read with the weights goes through as made; the function is transformers' own
    again once the outermost opening closes, also when it closes on an error."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from harness.models.loading import _gguf_parsed_once, _metadata_read_once

    calls = []

    def original(path, return_tensors=False, **kwargs):
        calls.append((path, return_tensors, kwargs))
        return {"config": {"layers": [path]}}

    loading = _metadata_read_once(original)
    first, second = loading("a.gguf"), loading("a.gguf", return_tensors=False)
    first["config"]["layers"].append("changed")
    assert second == {"config": {"layers": ["a.gguf"]}} == loading("a.gguf") and calls == [("a.gguf", False, {})]
    loading("a.gguf", return_tensors=True, model_to_load=None)
    loading("b.gguf")
    assert calls[1:] == [("a.gguf", True, {"model_to_load": None}), ("b.gguf", False, {})]
    transformers_own = gguf_utils.load_gguf_checkpoint
    with pytest.raises(RuntimeError):
        with _gguf_parsed_once():
            with _gguf_parsed_once():
                assert gguf_utils.load_gguf_checkpoint is not transformers_own
            assert gguf_utils.load_gguf_checkpoint is not transformers_own
            raise RuntimeError
    assert gguf_utils.load_gguf_checkpoint is transformers_own


def test_a_checkpoint_folder_loads_where_the_gguf_library_is_missing(tiny_checkpoint, monkeypatch):
    """A GPU node may lack gguf (GGUF files only need it): a checkpoint folder is checked and loaded without it."""
    import sys

    from harness.models.loading import ModelSpec, _config_and_tokenizer, load

    monkeypatch.setitem(sys.modules, "gguf", None)                  # `import gguf` raises ImportError
    _config_and_tokenizer.cache_clear()
    model, _ = load(ModelSpec("tiny", tiny_checkpoint, device="cpu"))
    assert model.config.model_type == "llama"


def _fake_split(tmp_path, monkeypatch, contents):
    """Part packages like the Qwen2.5-Coder ones (fake_part1..n, each data/partNN.bin) on sys.path, and the
    SplitGGUF that pins the sha256 of their joined content."""
    import hashlib

    from harness.models.loading import SplitGGUF

    for i, content in enumerate(contents, 1):
        data = tmp_path / "site" / f"fake_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{i:02d}.bin").write_bytes(content)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("MEMDEFRAG_CACHE", str(tmp_path / "cache"))
    packages = tuple(f"fake_part{i}" for i in range(1, len(contents) + 1))
    return SplitGGUF("fake", "fake.gguf", packages, "pip install fake-part1 fake-part2",
                     hashlib.sha256(b"".join(contents)).hexdigest())


def test_split_gguf_parts_are_joined_in_order_once_and_verified(tmp_path, monkeypatch):
    split = _fake_split(tmp_path, monkeypatch, [b"GGUF first half ", b"second half"])
    joined = split.path()
    assert joined.read_bytes() == b"GGUF first half second half"
    assert split.path() == joined and joined.parent == tmp_path / "cache" / "gguf"


def test_a_damaged_part_is_refused_in_one_line_and_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    from harness.errors import ConfigError

    split = _fake_split(tmp_path, monkeypatch, [b"GGUF first half ", b"second half"])
    (tmp_path / "site" / "fake_part2" / "data" / "part02.bin").write_bytes(b"second halF")     # one byte flipped
    with pytest.raises(ConfigError) as refused:
        split.path()
    line = str(refused.value)
    assert "\n" not in line and line.startswith("model=fake: its joined parts have sha256 ")
    assert f"not the pinned {split.sha256}" in line and "nothing was loaded" in line
    assert line.endswith("Reinstall: pip install fake-part1 fake-part2")
    assert not [p for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.endswith(".lock")]


def test_a_missing_part_package_names_the_install_command(tmp_path, monkeypatch):
    from harness.errors import ConfigError
    from harness.models.loading import QWEN25_CODER

    split = _fake_split(tmp_path, monkeypatch, [b"a", b"b"])
    missing = type(split)("fake", "fake.gguf", (*split.packages, "fake_part_absent"), split.install, split.sha256)
    with pytest.raises(ConfigError, match=r"^this embedded model needs the package fake-part-absent: pip install fake-part1 fake-part2$"):
        missing.path()
    assert QWEN25_CODER["qwen25_coder_15b"].install == "make setup-qwen25-coder-15b"
