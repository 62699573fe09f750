"""The AUTO engine policy: which engines to try, in which order, for a constraint.

Soundness first, then coverage, then speed. The caller (``ConstraintCompiler``) tries the engines
in order and uses the first that compiles; an engine refuses (``ConstraintError``) what its
soundness guard (``schema_support``) or the engine itself cannot enforce, so a later engine only
sees what the earlier ones refused, and the order decides coverage. Only engines that implement
a kind are listed for it (``SUPPORTS``).

Measured with bench/constraints_soundness.py and bench/maskbench.py (SmolLM2-135M tokenizer,
xgrammar 0.2.9, llguidance 1.9.1, outlines-core 0.2.14, 2-core CPU shared with other jobs, so
times are indicative; 2026-11-29):

JSON Schema Test Suite 2020-12 incl. optional/ (75 categories with cases, 434 cases, 2,167 instances)
    engine      full categories  cases compiled  over (instances)  under (instances)
    llguidance  18               177             32                3
    xgrammar     1                77             20                0
    outlines     0                59             22                4
  llguidance's 3: a const/enum string with U+0000 accepted without it (the adapter's
  json_allowed_escapes), ``\\S`` accepting U+FEFF; outlines' 4: ``\\d``/``\\w`` matching non-ASCII
  digits/letters, ``\\S`` accepting U+FEFF (ECMA-262 classes differ from the engines' Rust ones).

MaskBench, 40 schemas per split (320), compile limit 10 s
    engine      compiled  passed  compile p50/p90 ms  mask p50/p99 µs  valid rej.  invalid acc.
    llguidance  42%       143     2.2 / 10.6          24 / 8100        0           0
    xgrammar    38%       127     15 / 45             5.5 / 181        4           0
    outlines    31%       100     430 / 1290 (14 timeouts)  8.4 / 197  9           2
  outlines' 2: ``pattern`` dropped beside ``minLength``/``maxLength``; ``date-time`` without a
  time offset. Targeted probes: xgrammar drops ``minLength``/``maxLength`` beside ``pattern`` or
  ``format`` (under-constrained, the guard lets it through).

Hence:

* JSON Schema: llguidance first (most coverage, fastest compile, no under-constraint on
  MaskBench; it refuses what it does not implement), then xgrammar (no under-constraint measured
  on either bench; fastest masks), then outlines last (the only engine measured under-constrained
  on MaskBench; in the sample it added 2 schemas, both ``date-time``). AUTO on MaskBench: 144
  passed, llguidance chosen 143 times.
* Regex: llguidance, xgrammar, outlines. On 15 everyday regexes all three rejected every
  non-matching string, but xgrammar has pathological tails (``[^\\n]{1,200}`` compiles in 6.6 s,
  ``[a-z]{1,300}`` 1.2 s, ``(\\w+ ){2,5}\\w+`` masks ~44 ms) where llguidance stays under 30 ms
  compile; outlines-core times out on both bounded repetitions and rejects valid strings after a
  final state (``-12.5`` for a number regex: a token from an accepting state into a non-accepting
  one is never allowed).
* Choice: xgrammar, llguidance, outlines. Literal alternatives have no repetition tails; xgrammar
  compiles 2-4× and masks 5× faster than llguidance (compile p50 0.9 vs 3.3 ms, mask p50 4.7 vs
  29 µs), both sound; outlines rejects ``ab`` among ``a|ab|abc`` (same final-state bug).
* Lark grammars: llguidance only. EBNF (GBNF): xgrammar (native) then llguidance (via
  ``gbnf_to_lark``).
"""

from __future__ import annotations

from proctor.constraints.spec import ConstraintKind, ConstraintSpec, GrammarSyntax

JSON, REGEX, CHOICE, LARK, EBNF = "json_schema", "regex", "choice", "grammar:lark", "grammar:ebnf"

# What each engine's adapter implements at all (before any guard).
SUPPORTS: dict[str, frozenset[str]] = {
    "xgrammar": frozenset({JSON, REGEX, CHOICE, EBNF}),
    "llguidance": frozenset({JSON, REGEX, CHOICE, LARK, EBNF}),
    "outlines": frozenset({JSON, REGEX, CHOICE}),
}

ORDER: dict[str, tuple[str, ...]] = {
    JSON: ("llguidance", "xgrammar", "outlines"),
    REGEX: ("llguidance", "xgrammar", "outlines"),
    CHOICE: ("xgrammar", "llguidance", "outlines"),
    LARK: ("llguidance",),
    EBNF: ("xgrammar", "llguidance"),
}


def policy_key(spec: ConstraintSpec) -> str:
    """The row of ``ORDER`` for ``spec``: its kind, and for grammars the syntax."""
    if spec.kind is ConstraintKind.GRAMMAR:
        return f"grammar:{(spec.syntax or GrammarSyntax.LARK).value}"
    return spec.kind.value


def backend_order(spec: ConstraintSpec) -> tuple[str, ...]:
    """Engines to try for ``spec``, best first; the caller falls back to the next on refusal."""
    return ORDER[policy_key(spec)]
