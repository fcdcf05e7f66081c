"""Model sources: GGUF conversions are cached by content, not by file name."""

from harness.models import content_key, converted_folder


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
    from harness.models import one_line_cause

    err = OSError("Can't load tokenizer for '/data/m'. Make sure that it holds a tokenizer from one of:\n"
                  "- tokenizer.json\n- vocab.txt\n")
    assert one_line_cause(err) == ("Can't load tokenizer for '/data/m'. Make sure that it holds a tokenizer from "
                                   "one of: - tokenizer.json - vocab.txt")
    err = OSError("/data/m does not appear to have a file named x.gguf. Checkout 'https://huggingface.co//data/m/tree/"
                  "main' for available files.")
    assert one_line_cause(err) == "/data/m does not appear to have a file named x.gguf."
    assert one_line_cause(OSError("x" * 500)).endswith("...") and len(one_line_cause(OSError("x" * 500))) == 400
