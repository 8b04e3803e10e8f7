"""Text <-> token ids for a GGUF model (SmolLM2), built with the `tokenizers` library.

The GGUF file carries everything a byte-level BPE tokenizer needs: the vocabulary
(`tokenizer.ggml.tokens`, 49,152 strings), the ranked merges (`tokenizer.ggml.merges`) and
each token's type (`tokenizer.ggml.token_type`; 3 = control token). Encoding text runs:

1. special tokens first: the control tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`,
   ...; ids 0-16 in SmolLM2) are found in the raw text and each becomes one id;
2. pre-tokenisation of the text between them: every digit is split off on its own, then the
   GPT-2 regex cuts words, runs of spaces and punctuation, and each piece's UTF-8 bytes are
   mapped to printable characters (a space becomes "Ġ", a newline "Ċ");
3. BPE: inside each piece, the pair of neighbouring symbols with the best-ranked merge is
   joined, again and again, until no merge applies; each final symbol is a vocabulary id.

Nothing is prepended (no BOS token). Decoding maps ids back to their byte strings and the
bytes back to UTF-8 text, so decode(encode(text)) == text, with one exception: 21 byte values
have no token in SmolLM2's vocabulary (six rare control characters such as 0x04, bytes that
never occur in UTF-8, and the lead bytes 0xF1/0xF2 of code points U+40000..U+BFFFF); the
tokenizer drops them, as llama.cpp's does. `chat_template` writes a conversation the way SmolLM2-Instruct was
trained to read it (ChatML).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .gguf_file import UnsupportedModelError, metadata_value, open_gguf

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
USER_DEFINED_TOKEN_TYPE = 4
ROLES = ("system", "user", "assistant")


def chat_template(messages, add_generation_prompt: bool = True,
                  default_system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """A conversation as SmolLM2-Instruct reads it (ChatML).

    messages: a list of {"role": "system"|"user"|"assistant", "content": str}. When the first
    message is not a system message, the default system prompt is put first. Each message
    becomes "<|im_start|>{role}\\n{content}<|im_end|>\\n"; add_generation_prompt appends
    "<|im_start|>assistant\\n", the cue for the model to answer."""
    messages = check_messages(messages)
    parts = []
    if messages[0]["role"] != "system":
        parts.append(f"<|im_start|>system\n{default_system_prompt}<|im_end|>\n")
    for message in messages:
        parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def check_messages(messages) -> list:
    """Validate a conversation: a non-empty list of {"role", "content"} dicts of strings."""
    if isinstance(messages, (str, dict)) or not hasattr(messages, "__iter__"):
        raise TypeError('messages must be a list of {"role": ..., "content": ...} dicts, '
                        f"got {type(messages).__name__}")
    messages = list(messages)
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ValueError(f'message {i} must be a dict with exactly the keys "role" and "content", '
                             f"got {message!r}")
        if message["role"] not in ROLES:
            raise ValueError(f"message {i} has role {message['role']!r}; allowed roles: {ROLES}")
        if not isinstance(message["content"], str):
            raise TypeError(f"message {i} content must be a string, got {type(message['content']).__name__}")
    return messages


def check_text(text) -> str:
    """`text` if it is a str of valid Unicode; else a one-line error saying what is wrong.

    Bytes that are not valid UTF-8 reach Python as lone surrogates: a command-line argument
    or a file read with errors="surrogateescape" turns byte 0xFF into U+DCFF. The tokenizer
    (like UTF-8 itself) has no place for them."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = (f"the byte 0x{code - 0xDC00:02X}, which is not valid UTF-8" if 0xDC80 <= code <= 0xDCFF
                else f"an unpaired surrogate U+{code:04X}")
        raise ValueError(f"the text holds {what} (character {exc.start} of {len(text)}); text must be valid "
                         f"Unicode, i.e. UTF-8 encoded") from None
    return text


@lru_cache(maxsize=1)
def byte_decoder() -> dict:
    """GPT-2's byte-level alphabet, reversed: printable character -> the byte it stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class Tokenizer:
    """A byte-level BPE tokenizer with special tokens and a chat template.

    `.hf` is the underlying `tokenizers.Tokenizer`. Ids are plain Python ints."""

    def __init__(self, hf_tokenizer, *, eos_id: int, bos_id: int | None = None, name: str = "tokenizer",
                 default_system_prompt: str = DEFAULT_SYSTEM_PROMPT, chat_template_source: str | None = None):
        self.hf = hf_tokenizer
        self.chat_template_source = chat_template_source  # the file's Jinja template, for reference
        self.eos_id = int(eos_id)
        self.bos_id = None if bos_id is None else int(bos_id)
        self.name = name
        self.default_system_prompt = default_system_prompt
        self.special_ids = tuple(sorted(i for i, t in self.hf.get_added_tokens_decoder().items()
                                        if t.special))  # control tokens, e.g. <|im_end|>

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list:
        """Token ids of `text` (special tokens written in the text become their single id)."""
        return self.hf.encode(check_text(text), add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of a sequence of ids (bytes split across ids are joined before decoding)."""
        return self.hf.decode([self._check_id(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _check_id(self, i) -> int:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"token ids must be integers, got {i!r}")
        i = int(i)
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} is out of range: ids must be in 0..{self.vocab_size - 1}")
        return i

    def token(self, i: int) -> str:
        """The vocabulary entry of id i, in byte-level form ("Ġcapital": Ġ stands for a space)."""
        return self.hf.id_to_token(self._check_id(i))

    def token_bytes(self, i: int) -> bytes:
        """The exact bytes id i stands for (a piece of a UTF-8 character for some ids)."""
        text = self.token(i)
        if int(i) in self.special_ids:
            return text.encode()
        table = byte_decoder()
        return bytes(table[c] for c in text)

    def pieces(self, ids) -> list:
        """Each id's text on its own (an incomplete UTF-8 character shows as U+FFFD)."""
        return [self.token_bytes(i).decode("utf-8", errors="replace") for i in ids]

    def stream(self, skip_special_tokens: bool = False) -> TextStream:
        """An incremental decoder: feed ids one at a time, get text as soon as it is complete."""
        return TextStream(self, skip_special_tokens)

    def chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return chat_template(messages, add_generation_prompt, self.default_system_prompt)

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list:
        """Token ids of a conversation written with the chat template."""
        return self.encode(self.chat_template(messages, add_generation_prompt))

    def save(self, folder) -> None:
        """Write tokenizer.json (the `tokenizers` format) and tokenizer_config.json."""
        folder = Path(folder)
        self.hf.save(str(folder / "tokenizer.json"))
        config = {"eos_id": self.eos_id, "bos_id": self.bos_id, "name": self.name,
                  "default_system_prompt": self.default_system_prompt,
                  "chat_template_source": self.chat_template_source}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))

    @classmethod
    def load(cls, folder) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        return cls(HFTokenizer.from_file(str(folder / "tokenizer.json")), **config)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class TextStream:
    """Streaming decode: `step(id)` returns the new text ("" while a character is incomplete)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        chunk = self._stream.step(self.tokenizer.hf, self.tokenizer._check_id(token_id))
        return chunk or ""


def tokenizer_from_gguf(reader, name: str | None = None) -> Tokenizer:
    """Build the tokenizer from a GGUF file's vocabulary, merges and token types.

    `reader` is a path or a `gguf.GGUFReader`. Only byte-level BPE (`tokenizer.ggml.model`
    "gpt2") with SmolLM2's pre-tokenisation (digits split one by one) is implemented."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    if isinstance(reader, (str, Path)):
        reader = open_gguf(reader)
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise UnsupportedModelError("this GGUF file carries no tokenizer (no tokenizer.ggml.tokens)")
    kind = metadata_value(reader, "tokenizer.ggml.model")
    pre = metadata_value(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in ("smollm", "default", "gpt-2"):
        raise UnsupportedModelError(
            f"tokenizer {kind!r} with pre-tokeniser {pre!r} is not supported: only byte-level BPE "
            f"('gpt2') with the 'smollm' pre-tokeniser (digits split one by one) is implemented")
    tokens = metadata_value(reader, "tokenizer.ggml.tokens")
    types = metadata_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ")) for m in metadata_value(reader, "tokenizer.ggml.merges")]
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise UnsupportedModelError(f"merge {' '.join(bad)!r} is not a pair of symbols")
    vocab = {token: i for i, token in enumerate(tokens)}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == CONTROL_TOKEN_TYPE]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == USER_DEFINED_TOKEN_TYPE]
    hf.add_special_tokens(special)
    if user:
        hf.add_tokens(user)
    eos = metadata_value(reader, "tokenizer.ggml.eos_token_id", None)
    bos = metadata_value(reader, "tokenizer.ggml.bos_token_id", None)
    return Tokenizer(hf, eos_id=eos if eos is not None else 0, bos_id=bos,
                     name=name or str(metadata_value(reader, "general.name", "gguf")),
                     chat_template_source=metadata_value(reader, "tokenizer.chat_template", None))

