"""Grammar-constrained sampling with llguidance: compile once per description, mask every step.

A description is a :class:`ToolCallGrammar` (forced tool call) or a :class:`JsonAnswerGrammar`
(structured output). Per request the engine holds one :class:`ToolCallMatcher` (an
``llguidance.LLMatcher`` over the
model's tokenizer). Before each sampling of that request it asks the matcher which token ids may
come next (a bitmask, one bit per id), sets every other logit to ``-inf`` and samples as usual
(greedy, temperature, top-k, top-p; the same masking-before-warpers order as vLLM's structured
outputs), then feeds the sampled id back to the matcher. End-of-sequence ids are allowed only
when the grammar accepts, and once it cannot be extended they are the only ids allowed, so the
request ends by its own EOS (finish reason ``stop``).

:class:`GrammarCompiler` builds the llguidance tokenizer lazily (on the first constrained
request) and keeps compiled matchers by description (an LRU); each request gets a
``deep_copy`` of the cached one. llguidance is imported lazily too, so unconstrained serving
never loads it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import replace

import torch

from freetoken.constrain.answer import answer_grammar_text
from freetoken.constrain.lark import grammar_text
from freetoken.constrain.spec import GrammarError, JsonAnswerGrammar, ToolCallGrammar
from freetoken.core import SamplingParams
from freetoken.engine.sampler import SampledToken, sample
from freetoken.tokenizer.tokenizer import Tokenizer

_SHIFTS = torch.arange(32, dtype=torch.int32)
_EXCERPT = re.compile(r"\s+\d+ \| ")  # "   5 | args_0: ..." lines of llguidance's errors
_POSITION = re.compile(r"^at \d+\(\d+\): ")


def unpack_bitmask(words: torch.Tensor, n: int) -> torch.Tensor:
    """Token mask from llguidance's packed bitmask (plain-torch reference of its layout).

    Args:
        words: ``[W]`` int32; bit ``b`` of word ``w`` (least significant first) is token id
            ``32 * w + b``.
        n: number of ids to return (ids at and past ``32 * W`` are not allowed).

    Returns:
        ``[n]`` bool, True where the token is allowed.
    """
    bits = ((words.unsqueeze(-1) >> _SHIFTS.to(words.device)) & 1).bool().flatten()  # [32 W]
    if bits.numel() >= n:
        return bits[:n]
    return torch.cat([bits, bits.new_zeros(n - bits.numel())])


def _clean(error: str) -> str:
    """llguidance's error message without its position prefix and grammar excerpt."""
    lines = []
    for line in error.splitlines():
        if _EXCERPT.match(line):
            break
        lines.append(line)
    return _POSITION.sub("", "\n".join(lines).strip())


def _validation_error(lark: str) -> str:
    import llguidance

    return _clean(llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_lark(lark)))


def check_grammar(spec: ToolCallGrammar) -> None:
    """Compile ``spec`` without a tokenizer (tags as text) to reject bad schemas early.

    Raises:
        GrammarError: a tool schema cannot be built into a grammar or llguidance rejects it
            (``the tool schemas cannot be compiled into a grammar: tool 'NAME': <llguidance's
            message>``).
    """
    if not _validation_error(grammar_text(spec)):
        return
    for tool in spec.tools:  # name the first tool whose schema fails on its own
        error = _validation_error(grammar_text(replace(spec, tools=(tool,))))
        if error:
            raise GrammarError(
                f"the tool schemas cannot be compiled into a grammar: tool {tool.name!r}: {error}")
    raise GrammarError(f"the tool schemas cannot be compiled into a grammar: "
                       f"{_validation_error(grammar_text(spec))}")


def check_answer_grammar(spec: JsonAnswerGrammar) -> None:
    """Compile ``spec``'s answer grammar without a tokenizer to reject a bad schema early (the
    alternative calls are :func:`check_grammar`'s to check).

    Raises:
        GrammarError: llguidance rejects the schema (``the schema cannot be compiled into a
            grammar: <llguidance's message>``).
    """
    error = _validation_error(answer_grammar_text(replace(spec, calls=None)))
    if error:
        raise GrammarError(f"the schema cannot be compiled into a grammar: {error}")


class ToolCallMatcher:
    """One request's position in its grammar.

    Args:
        matcher: a fresh ``llguidance.LLMatcher`` (owned from now on).
        vocab_size: token ids the matcher knows (the tokenizer's size, added tokens included).
        label: what the grammar describes, for error messages (``tool-call``, ``JSON-answer``).
    """

    def __init__(self, matcher, vocab_size: int, label: str = "tool-call") -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self.label = label
        self._words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)  # [W]

    @property
    def done(self) -> bool:
        """True once the grammar cannot be extended (only EOS may follow) or EOS was taken."""
        return self._m.is_stopped()

    def allowed(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Which of ``n`` logit columns may be sampled next.

        Returns:
            ``[n]`` bool on ``device`` (columns past the tokenizer's vocabulary are False).

        Raises:
            GrammarError: the matcher is in an error state or allows nothing.
        """
        words = self._words
        self._m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        if self._m.is_error() or not bool(words.any()):
            why = self._m.get_error() or "no token allowed"
            raise GrammarError(f"{self.label} grammar failed: {why}")
        return unpack_bitmask(words, n).to(device, non_blocking=True)

    def advance(self, token_id: int) -> None:
        """Feed the sampled token.

        Raises:
            GrammarError: the grammar does not allow ``token_id`` here.
        """
        if not self._m.consume_token(token_id):
            raise GrammarError(
                f"{self.label} grammar rejected token {token_id}: {self._m.get_error()}")

    def sample(self, logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None,
               raw_logits: torch.Tensor | None = None) -> SampledToken:
        """Mask ``logits`` (``[V]``) to the grammar, sample (``engine.sampler.sample``) and advance.

        Logprobs stay those of the raw logits (``raw_logits`` when the picking logits were
        biased), as in unconstrained sampling.

        Raises:
            GrammarError: see :meth:`allowed` and :meth:`advance`.
        """
        picked = sample(logits, params, generator, self.allowed(logits.shape[-1], logits.device),
                        raw_logits=raw_logits)
        self.advance(picked.token_id)
        return picked


class GrammarCompiler:
    """Compiles :class:`ToolCallGrammar` / :class:`JsonAnswerGrammar` descriptions for one
    tokenizer, with an LRU cache.

    Args:
        tokenizer: the model's tokenizer (its ``tokenizer.json`` text is handed to llguidance).
        eos_token_ids: the ids that end a constrained generation (the model's EOS ids).
        cache_size: compiled grammars kept.
    """

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...],
                 cache_size: int = 32) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.cache_size = cache_size
        self._lltok = None
        self._cache: OrderedDict[ToolCallGrammar | JsonAnswerGrammar, object] = OrderedDict()

    def _llg_tokenizer(self):
        if self._lltok is None:
            import llguidance

            self._lltok = llguidance.LLTokenizer(
                self.tokenizer.hf.to_str(), n_vocab=self.tokenizer.vocab_size,
                eos_token=list(self.eos_token_ids),
            )
        return self._lltok

    def _tag_ref(self, text: str) -> str | None:
        token = self.tokenizer.token_to_id(text)
        if token is None or not self._llg_tokenizer().is_special_token(token):
            return None
        return f"<[{token}]>"

    def grammar(self, spec: ToolCallGrammar | JsonAnswerGrammar) -> str:
        """The Lark text of ``spec`` for this tokenizer (tags as special tokens where they are).

        Raises:
            GrammarError: see ``grammar_text`` / ``answer_grammar_text``.
        """
        if isinstance(spec, JsonAnswerGrammar):
            return answer_grammar_text(spec, self._tag_ref)
        return grammar_text(spec, self._tag_ref)

    def matcher(self, spec: ToolCallGrammar | JsonAnswerGrammar) -> ToolCallMatcher:
        """A fresh matcher at the start of ``spec``'s grammar.

        Raises:
            GrammarError: no EOS ids, a bad description, or llguidance rejects the grammar.
        """
        if not isinstance(spec, (ToolCallGrammar, JsonAnswerGrammar)):
            raise GrammarError("SamplingParams.grammar must be a ToolCallGrammar or a "
                               f"JsonAnswerGrammar, got {type(spec).__name__}")
        if not self.eos_token_ids:
            raise GrammarError("a constrained grammar needs the model's end-of-sequence token ids")
        answer = isinstance(spec, JsonAnswerGrammar)
        compiled = self._cache.get(spec)
        if compiled is None:
            import llguidance

            compiled = llguidance.LLMatcher(
                self._llg_tokenizer(), llguidance.LLMatcher.grammar_from_lark(self.grammar(spec)),
                log_level=0,
            )
            if compiled.is_error():
                what = "the schema" if answer else "the tool schemas"
                raise GrammarError(f"{what} cannot be compiled into a grammar: "
                                   f"{_clean(compiled.get_error())}")
            self._cache[spec] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(spec)
        return ToolCallMatcher(compiled.deep_copy(), self.tokenizer.vocab_size,
                               "JSON-answer" if answer else "tool-call")
