"""How a question becomes the prompt a model reads: the text a prompt style puts before and after it."""

from __future__ import annotations

from enum import StrEnum

import torch

PromptStyle = StrEnum("PromptStyle", ["chat", "plain"])   # what a run asks for; a task may also word its own (raw)
QUESTION_MARK = "\ue000"                                  # a private-use character no template writes itself


def prompt_template(tokenizer, style: str) -> tuple[str, str]:
    """The text before and after the question: the authors' plain `question + " Answer: "`, the tokenizer's
    chat template (its header before, its generation prompt after), or 'raw': the text as given (a task that
    words its own prompt)."""
    if style == "plain":
        return "", " Answer: "
    if style == "raw":
        return "", ""
    if style == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("prompt='chat' needs a tokenizer with a chat template; use prompt='plain'")
        text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION_MARK}], tokenize=False,
                                             add_generation_prompt=True)
        before, _, after = text.partition(QUESTION_MARK)
        return before, after
    raise ValueError(f"prompt={style!r} is not one of {[*map(str, PromptStyle), 'raw']}")


def token_ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long, device="cpu")


def format_prompt(tokenizer, question: str, style: str) -> torch.Tensor:
    """Prompt ids: the question inside the style's text, tokenized as one string."""
    before, after = prompt_template(tokenizer, style)
    return token_ids(tokenizer, before + question + after)


def read_prompt(tokenizer, question: str, style: str, header: list[int]) -> torch.Tensor:
    """The ids read after a memory whose sink holds `header` (formation=shared_prefix): what follows the style's
    header where it is that header, else the whole prompt."""
    before, after = prompt_template(tokenizer, style)
    if header and token_ids(tokenizer, before).tolist() == header:
        return token_ids(tokenizer, question + after)
    return format_prompt(tokenizer, question, style)


def prompt_header(tokenizer, style: str) -> list[int]:
    """The ids of the text a prompt puts before its question (APE's shared prefix: the chat header)."""
    return token_ids(tokenizer, prompt_template(tokenizer, style)[0]).tolist()
