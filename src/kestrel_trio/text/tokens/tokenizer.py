"""The Qwen byte-level BPE tokenizer and the checkpoint facts that come with it.

:class:`Tokenizer` wraps a ``tokenizers.Tokenizer`` (the exact Rust
implementation, so ids match the reference byte for byte) and gathers what the
rest of kestrel-trio needs from a checkpoint folder: the end-of-sequence ids,
the chat template and the sampling defaults of ``generation_config.json``.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import tokenizers
from tokenizers import decoders

from kestrel_trio._model import check_folder_files, confined
from kestrel_trio.errors import KestrelError, ModelLoadError

__all__ = ["Tokenizer", "SPECIAL_TOKEN_NAMES", "GENERATION_SAMPLING_KEYS", "tokenizer_failure", "NORMALIZER_SHRINK"]

# The named special tokens a tokenizer_config.json may declare; transformers
# passes them to chat templates as variables (bos_token, eos_token, ...).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# The generation_config.json fields that describe sampling.
GENERATION_SAMPLING_KEYS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repetition_penalty",
)


def _byte_level_alphabet() -> dict[str, int]:
    """Map each character of the byte-level BPE alphabet back to its byte.

    Byte-level BPE spells every byte as one printable character: bytes that are
    already printable (and not a space) stand for themselves; the other 68 are
    shifted, in byte order, to code points 256 and up.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    char_to_byte = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if chr(b) not in char_to_byte:
            char_to_byte[chr(256 + shifted)] = b
            shifted += 1
    return char_to_byte


_BYTE_OF_CHAR = _byte_level_alphabet()


def _read_optional_json(path: Path) -> dict[str, Any] | None:
    """Read an optional JSON object file; a missing file gives ``None``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ModelLoadError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path.name} must hold a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_chat_template(config: Mapping[str, Any]) -> str | None:
    """The chat template stored in tokenizer_config.json, if any.

    Older checkpoints may store a list of named templates; the one named
    "default" is the chat template.
    """
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


_GIL_FREE_FROM_CHARS = 4096
# A longer text is encoded in pieces of about this many characters, each ending right after an added token
# (``<|im_end|>``...): the tokenizer splits its input at added tokens before anything else, so the pieces'
# tokens are the whole text's. Even the batch call holds the GIL for a time that grows with the text (measured
# on the 2-core Zen 3: a 1.7 MB prompt of 60,000 chat turns, 84 ms in one call, against 20 ms for a quarter of
# it); pieces let the event loop in between.
_PIECE_CHARS = 1 << 16
# A text longer than this, checked against a token limit, is first counted piece by piece (cut at whitespace,
# not exact), so that one far over the limit is refused after a few pieces: never all its tokens in memory at
# once (a 4 MB text is 1.9 M tokens, whose encoding took 900 MB).
_ROUGH_FROM_CHARS = 4 * _PIECE_CHARS
# Tokens a rough cut may change (merges lost or made across it): far more than a byte-level BPE changes there.
_CUT_SLACK = 64
# How many times fewer characters a Unicode normalizer (NFC, NFKC...) may leave: composing a Hangul syllable
# from its three jamo, or a letter from two combining marks, turns three characters into one.
NORMALIZER_SHRINK = 3


def _is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic raised through pyo3 (``pyo3_runtime.PanicException``, a BaseException)."""
    return type(exc).__name__ == "PanicException"


def tokenizer_failure(exc: BaseException, what: str) -> KestrelError:
    """The error of one request whose text the Rust tokenizer failed on (a panic or an error), naming the file.

    The process goes on: a panic in tokenizers leaves no shared state broken (each call has its own).
    """
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return KestrelError(f"the model's tokenizer (tokenizer.json or the GGUF vocabulary) failed to {what} this "
                        f"text: {first}", code="tokenizer_failed")


class Tokenizer:
    """A byte-level BPE tokenizer with its checkpoint's special tokens and defaults.

    Build one with :meth:`from_folder` or :meth:`from_demo`.

    Attributes:
        eos_token_ids: ids that end a generation (generation_config.json
            ``eos_token_id`` united with tokenizer_config.json ``eos_token``).
        special_token_ids: ids of the added tokens marked special (the ones
            ``decode(..., skip_special_tokens=True)`` drops).
        special_tokens_map: named special tokens (``eos_token`` ...) as strings,
            the extra variables transformers hands to chat templates.
        chat_template: the Jinja chat template source, or ``None``.
        generation_defaults: the sampling fields of generation_config.json, as read.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        tokenizer_config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> None:
        """Wrap a loaded ``tokenizers.Tokenizer``.

        Args:
            backend: the Rust tokenizer (from tokenizer.json).
            tokenizer_config: the parsed tokenizer_config.json, if any.
            generation_config: the parsed generation_config.json, if any.
            chat_template: a template that overrides tokenizer_config's one
                (chat_template.jinja takes precedence, as in transformers).

        Raises:
            ModelLoadError: the decoder is not byte-level, or an eos token is
                not in the vocabulary.
        """
        if not isinstance(backend.decoder, decoders.ByteLevel):
            raise ModelLoadError(
                f"tokenizer.json: decoder {type(backend.decoder).__name__} is not supported; "
                "kestrel-trio serves byte-level BPE (Qwen) tokenizers"
            )
        self._backend = backend
        self._shrink = 1 if backend.normalizer is None else NORMALIZER_SHRINK  # see char_limit
        # Added tokens matched in the raw text: the tokenizer cuts its input at them first (see _PIECE_CHARS).
        self._splitting_tokens = tuple(sorted({t.content for t in backend.get_added_tokens_decoder().values()
                                               if not t.normalized and t.content}))
        config = dict(tokenizer_config or {})
        gen_config = dict(generation_config or {})
        added = backend.get_added_tokens_decoder()
        self.special_token_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        self.special_tokens_map: dict[str, str] = {
            name: content for name in SPECIAL_TOKEN_NAMES if (content := _token_content(config.get(name))) is not None
        }
        self.eos_token_ids: frozenset[int] = self._resolve_eos(config, gen_config)
        self.chat_template: str | None = chat_template if chat_template is not None else _config_chat_template(config)
        self.generation_defaults: dict[str, Any] = {k: gen_config[k] for k in GENERATION_SAMPLING_KEYS if k in gen_config}
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer files of a checkpoint folder.

        Reads tokenizer.json (required), and tokenizer_config.json,
        generation_config.json and chat_template.jinja when present.

        Raises:
            ModelLoadError: naming the missing or malformed file.
        """
        folder = Path(path)
        check_folder_files(folder)  # no file of the folder's may be a symlink out of it (nor read through one)
        tokenizer_file = confined(folder, "tokenizer.json")
        if not tokenizer_file.is_file():
            raise ModelLoadError(f"tokenizer.json not found in {folder}")
        # The small files first, so that a broken one fails fast.
        tokenizer_config = _read_optional_json(confined(folder, "tokenizer_config.json"))
        generation_config = _read_optional_json(confined(folder, "generation_config.json"))
        template_file = confined(folder, "chat_template.jinja")
        try:
            template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"chat_template.jinja cannot be read: {exc}") from exc
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except BaseException as exc:  # the Rust side raises plain Exception, or panics (a BaseException)
            if not (_is_panic(exc) or isinstance(exc, Exception)):
                raise
            raise ModelLoadError(f"{tokenizer_file}: cannot be loaded: {str(exc).strip()[:300]}") from None
        return cls(
            backend,
            tokenizer_config=tokenizer_config,
            generation_config=generation_config,
            chat_template=template,
        )

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], source: str) -> Tokenizer:
        """The tokenizer a GGUF file's metadata describes (see kestrel_trio.text.tokens.gguf_vocab).

        Args:
            metadata: the file's key/value metadata (``tokenizer.ggml.*``,
                ``tokenizer.chat_template``).
            source: the file's name, for messages.

        Raises:
            ModelLoadError: naming the unsupported tokenizer model, pre-tokenizer or malformed key.
        """
        from kestrel_trio.text.tokens.gguf_vocab import backend_from_gguf, special_tokens_from_gguf

        named, eos_ids = special_tokens_from_gguf(metadata, source)
        template = metadata.get("tokenizer.chat_template")
        return cls(
            backend_from_gguf(metadata, source),
            tokenizer_config=named,
            generation_config={"eos_token_id": eos_ids},
            chat_template=template if isinstance(template, str) else None,
        )

    @classmethod
    def from_demo(cls) -> Tokenizer:
        """Load the Qwen3 tokenizer packaged in ``kestrel_trio/_demo`` (see its NOTICE)."""
        demo = resources.files("kestrel_trio") / "_demo"
        try:
            tokenizer_json = gzip.decompress(demo.joinpath("tokenizer.json.gz").read_bytes()).decode("utf-8")
            config = json.loads(demo.joinpath("tokenizer_config.json").read_text(encoding="utf-8"))
            # Only the end-of-sequence ids of Qwen3 instruct models; no sampling defaults for random weights.
            generation = json.loads(demo.joinpath("generation_config.json").read_text(encoding="utf-8"))
            backend = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as exc:
            raise ModelLoadError(f"the packaged demo tokenizer cannot be loaded: {exc}") from exc
        return cls(backend, tokenizer_config=config, generation_config=generation)

    def _resolve_eos(self, config: Mapping[str, Any], gen_config: Mapping[str, Any]) -> frozenset[int]:
        ids: set[int] = set()
        gen_eos = gen_config.get("eos_token_id")
        for value in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if isinstance(value, int) and not isinstance(value, bool):
                ids.add(value)
            elif value is not None:
                raise ModelLoadError(f"generation_config.json: eos_token_id {value!r} is not a token id")
        eos_token = _token_content(config.get("eos_token"))
        if eos_token is not None:
            eos_id = self.token_to_id(eos_token)
            if eos_id is None:
                raise ModelLoadError(f"tokenizer_config.json: eos_token {eos_token!r} is not in the vocabulary")
            ids.add(eos_id)
        return frozenset(ids)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (151,669 for Qwen3)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no BOS/EOS is added (Qwen uses none).

        Long texts go through the backend's batch call, which releases the GIL
        while it works, so an encode in a worker thread never stalls the event loop.
        """
        return self.encode_bounded(text, None)[0]

    def encode_with_specials(self, text: str) -> list[int]:
        """Token ids of ``text`` with the tokenizer's own post-processing (its special tokens added), as
        sentence-transformers encodes a text to embed: Qwen3-Embedding's tokenizer appends ``<|endoftext|>``,
        whose final hidden state is the embedding; a tokenizer that adds nothing gives :meth:`encode`'s ids."""
        try:
            return self._backend.encode_batch([text], add_special_tokens=True)[0].ids  # the batch call frees the GIL
        except BaseException as exc:
            raise self._failure(exc, "encode") from None

    def encode_bounded(self, text: str, limit: int | None) -> tuple[list[int] | None, int]:
        """The token ids of ``text`` (None when there are more than ``limit``) and their count.

        Building a Python list of millions of ids holds the GIL for tens of
        milliseconds; a prompt that cannot fit the context needs only its count.
        """
        if limit is not None:
            if len(text) > self.char_limit(limit):  # cannot fit: refused before any Rust call
                return None, self.fewest_tokens(text)
            if len(text) > _ROUGH_FROM_CHARS:
                rough = self._rough_count(text, limit)
                if rough is not None:
                    return None, rough
        try:
            if len(text) < _GIL_FREE_FROM_CHARS:
                encoding = self._backend.encode(text, add_special_tokens=False)
                total = len(encoding)
                return (None if limit is not None and total > limit else encoding.ids), total
            encodings = [self._encode_piece(piece) for piece in self._pieces(text)]
        except BaseException as exc:
            raise self._failure(exc, "encode") from None
        total = sum(len(e) for e in encodings)
        if limit is not None and total > limit:
            return None, total
        return [i for e in encodings for i in e.ids], total

    def _encode_piece(self, piece: str) -> tokenizers.Encoding:
        # The batch call releases the GIL while it works (encode does not).
        return self._backend.encode_batch([piece], add_special_tokens=False)[0]

    @staticmethod
    def _failure(exc: BaseException, what: str) -> BaseException:
        """A Rust panic or error of the tokenizer as this request's error; anything else (a cancellation) as is."""
        if _is_panic(exc) or isinstance(exc, Exception):
            return tokenizer_failure(exc, what)
        return exc

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token stands for (128 for Qwen3), added tokens included.

        Read one entry at a time: ``get_vocab`` builds the whole dictionary in one Rust call that holds the GIL
        (0.3 s for Qwen3's 151,669 entries on a loaded 2-core EPYC), which stalled the event loop and /health on
        a server's first request; id by id it takes about as long in all, the GIL passed on as usual.
        """
        added = self._backend.get_added_tokens_decoder()
        longest = max((len(token.content.encode("utf-8")) for token in added.values()), default=1)  # text
        for token_id in range(self._backend.get_vocab_size(with_added_tokens=True)):
            if token_id not in added:
                # Byte-level spelling, one character per byte: the pre-tokenizer hands BPE only that alphabet, so
                # an entry spelled otherwise can never stand for any text.
                longest = max(longest, len(self._backend.id_to_token(token_id) or ""))
        return longest

    def char_limit(self, tokens: int) -> int:
        """Characters beyond which a text cannot be ``tokens`` tokens or fewer.

        Each token stands for at most :attr:`max_token_bytes` bytes of the normalized text, a character is at
        least one byte, and a Unicode normalizer leaves at least 1/:data:`NORMALIZER_SHRINK` of them. (A
        normalizer that deletes text outright would break this bound; byte-level BPE checkpoints have none.)
        """
        return tokens * self.max_token_bytes * self._shrink

    def fewest_tokens(self, text: str) -> int:
        """A lower bound of the tokens of ``text`` from its length alone (see :meth:`char_limit`)."""
        per_token = self.char_limit(1)
        return -(-len(text) // per_token)

    def _rough_count(self, text: str, limit: int) -> int | None:
        """The tokens of ``text`` counted piece by piece, or None unless they are far more than ``limit``.

        Pieces are cut at whitespace, which for byte-level BPE changes a few tokens around each cut: far more
        than the slack allowed here. Counting stops as soon as the text is known to be over; only one piece's
        encoding is alive at a time.
        """
        counted, cuts, start = 0, 0, 0
        while start < len(text):
            end = min(len(text), start + _PIECE_CHARS)
            if end < len(text):
                half = start + _PIECE_CHARS // 2
                space = max(text.rfind(" ", half, end), text.rfind("\n", half, end))
                end = space if space > start else end
                cuts += 1
            try:
                counted += len(self._encode_piece(text[start:end]))
            except BaseException as exc:
                raise self._failure(exc, "encode") from None
            if counted > 2 * limit + _CUT_SLACK * cuts:
                return counted
            start = end
        return None

    def _pieces(self, text: str) -> Iterator[str]:
        """``text`` cut right after added tokens into pieces of about _PIECE_CHARS (fewer where it has none)."""
        start = 0
        while len(text) - start > 2 * _PIECE_CHARS:
            window = start + _PIECE_CHARS
            ends = [at + len(token) for token in self._splitting_tokens
                    if (at := text.find(token, window, window + _PIECE_CHARS)) >= 0]
            if not ends:
                break
            cut = min(ends)
            yield text[start:cut]
            start = cut
        yield text[start:]

    def to_json(self) -> str:
        """The backend tokenizer serialized as tokenizer.json text (what grammar engines build their vocabulary from)."""
        return self._backend.to_str()

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD, unknown ids are dropped."""
        try:
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        except BaseException as exc:
            raise self._failure(exc, "decode") from None

    def vocabulary(self) -> dict[str, int]:
        """Every vocabulary entry (byte-level spelling, added tokens included) -> its id."""
        return self._backend.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (byte-level spelling), or ``None``."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (byte-level spelling) of an id, or ``None``."""
        return self._backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes a token decodes to, or ``None`` for an unknown id.

        This mirrors the byte-level decoder: each character of the token maps
        back to one byte; a token with characters outside the byte alphabet
        (an added token such as ``<|im_end|>`` may have them) is taken as UTF-8.
        """
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        token = self._backend.id_to_token(token_id)
        if token is None:
            return None
        try:
            raw = bytes(_BYTE_OF_CHAR[ch] for ch in token)
        except KeyError:
            raw = token.encode("utf-8")
        self._bytes_cache[token_id] = raw
        return raw
