"""A model folder's chat template, rendered as transformers renders it (a sandboxed Jinja
environment with its globals and `{% generation %}` blocks) but bounded: a template is
untrusted input, so a render that runs past RENDER_SECONDS, or writes or builds a string past
its size limit, stops with one line naming the template and the conversation, as does any
error the template raises. `{% generation %}` blocks give the characters of each assistant
turn in the one render (`Rendered.spans`), as transformers' `return_assistant_tokens_mask`
takes them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from hookdump.errors import HookdumpError, opt, printable

RENDER_SECONDS = 30.0  # one conversation's rendering, its template's loops included
MOST_CHARS = 64 << 20  # the most characters a rendering (or a string it builds) may hold


class _Stop(Exception):
    """The render went past a bound."""


@dataclass
class _Budget:
    deadline: float

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Stop(f"took longer than {RENDER_SECONDS:g} s")


@dataclass
class Rendered:
    text: str
    spans: list[tuple[int, int]] = field(default_factory=list)  # {% generation %} blocks


@dataclass
class _Tracking:
    """The characters a render has written so far, and its generation blocks' spans."""

    size: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)


class _Env(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """transformers' environment, with a budget: `range` and string and list products
    checked against it as they run."""

    budget: _Budget | None = None
    tracking: _Tracking | None = None

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and isinstance(times, int)
                if sized and len(seq) * max(times, 0) > MOST_CHARS:
                    raise _Stop(f"builds a value of {len(seq) * times:,} items")
        if operator == "**" and isinstance(right, int) and abs(right) > 4096:
            raise _Stop(f"raises a number to the power {right:,}")
        return super().call_binop(context, operator, left, right)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: where the block's text lands, recorded."""

    tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension's own attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_block", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _block(self, caller: Any) -> str:
        """As transformers' AssistantTracker: the block starts where the output written so
        far ends."""
        text: str = caller()
        tracking: _Tracking | None = getattr(self.environment, "tracking", None)
        if tracking is not None:
            tracking.spans.append((tracking.size, tracking.size + len(text)))
        return text


class ChatTemplate:
    """A tokenizer's chat template compiled once; `where` names it in messages."""

    def __init__(self, source: str, where: str) -> None:
        self.where = where
        env = _Env(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals.update(
            raise_exception=_raise,
            strftime_now=lambda f: datetime.now().strftime(str(f)),
            range=self._range,
        )
        self.env = env
        self.has_generation = "generation" in source and "endgeneration" in source
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise self._error("cannot be read", exc) from None

    def render(self, messages: list[dict[str, str]], generation_prompt: bool, doc: str) -> Rendered:
        """`messages` rendered (`doc` names the conversation), each generation block's span."""
        budget = _Budget(time.monotonic() + RENDER_SECONDS)
        self.env.budget = budget
        tracking = _Tracking()
        self.env.tracking = tracking
        pieces: list[str] = []
        made = self.template.generate(messages=messages, add_generation_prompt=generation_prompt)
        try:
            for piece in made:
                budget.tick()
                pieces.append(piece)
                tracking.size += len(piece)
                if tracking.size > MOST_CHARS:
                    raise _Stop(f"writes more than {MOST_CHARS:,} characters")
        except _Stop as exc:
            raise self._error(f"stopped on {doc}: it {exc}", None) from None
        except RecursionError:
            raise self._error(f"stopped on {doc}: it recurses too deeply", None) from None
        except (
            jinja2.TemplateError,
            ArithmeticError,
            LookupError,
            TypeError,
            ValueError,
            AttributeError,
            MemoryError,
        ) as exc:
            raise self._error(f"failed on {doc}", exc) from None
        finally:
            self.env.budget = None
            self.env.tracking = None
        return Rendered("".join(pieces), tracking.spans)

    def _range(self, *args: Any) -> _Range:
        """`range`, as the sandbox's (at most MAX_RANGE items), each step on the budget."""
        return _Range(jinja2.sandbox.safe_range(*args), self.env.budget)

    def _error(self, what: str, exc: BaseException | None) -> HookdumpError:
        said = ""
        if exc is not None:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            said = f": {printable(first)[:200]}"
        return HookdumpError(
            f"{opt('chat', True)}: the chat template of {self.where} {what}{said}; fix the "
            f"template, or give another with {opt('tokenizer')}"
        )


@dataclass(frozen=True)
class _Range:
    values: range
    budget: _Budget | None

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[int]:
        for value in self.values:
            if self.budget is not None:
                self.budget.tick()
            yield value


def _raise(message: Any) -> None:
    raise jinja2.TemplateError(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
