r"""The AUTO engine policy: which engines to try, in which order, for a constraint.

Soundness first, then coverage, then speed. The caller (``ConstraintCompiler``) tries the engines
in order and uses the first that compiles; an engine refuses (``ConstraintError``) what its
soundness guard (constraints/json_schema/support.py) or the engine itself cannot enforce, so a later engine only
sees what the earlier ones refused, and the order decides coverage. Only engines that implement
a kind are listed for it (``engines.ENGINES``).

JSON Schema, measured 2026-12-01 with the deny-list guard, the exact rewrites and the validated
fallback (bench/README.md has the tables and commands; SmolLM2-135M tokenizer, xgrammar 0.2.9,
llguidance 1.9.1, outlines-core 0.2.14):

    whole MaskBench (7,158)   exact (mask alone)   served (exact or fallback)   invalid served
    llguidance, no guard      85%                  85%                          0
    llguidance + guard        90%                  90%                          0
    AUTO                      90%                  97%                          0
    Test Suite 2020-12 / 7    AUTO 20/43 / 20/35 categories exact, 31/43 / 28/35 served, 0 under-
                              constrained (llguidance without the guard: 2 under-constrained each)

  AUTO chose llguidance for 6,518 schemas, xgrammar for 28 (schemas llguidance refuses that
  xgrammar enforces soundly) and the fallback for 558. outlines-core added nothing once the
  fallback existed (1 schema in 320 beyond the other two, 2 invalid instances accepted, the
  slowest compile with multi-second tails that delay the fallback): it is not in AUTO's JSON
  order, only served when named.

Before (2026-11-29, allow-list guard; 40 schemas per split):

Measured then with bench/constraints_soundness.py and bench/maskbench.py (SmolLM2-135M tokenizer,
xgrammar 0.2.9, llguidance 1.9.1, outlines-core 0.2.14, adapters and guard as of 2026-11-29; a
2-core CPU shared with other jobs, so times are indicative, ratios hold across runs):

JSON Schema Test Suite 2020-12 (43 categories, 359 cases, 1,246 instances; compile limit 10 s)
    engine      full categories  cases compiled  over-constrained  under-constrained
    llguidance  12               143             18                0
    xgrammar     1                60             10                0
    outlines     0                46             12                0 (4 timeouts)
    AUTO        12               147             18                0
  With optional/ (75 categories, 434 cases): 18 / 1 / 0 full, 175 / 75 / 59 compiled, none
  under-constrained. (An earlier guard let 3-4 under-constraints through per engine: a U+0000
  const for llguidance, ECMA ``\d``/``\w``/``\S`` for llguidance and outlines; since refused.)

MaskBench, 40 schemas per split (320), compile limit 10 s
    engine      compiled  passed  compile p50/p90 ms  mask p50/p99 µs  valid rej.  invalid acc.
    llguidance  38%       122     1.8 / 3.4           20 / 592         0           0
    xgrammar    34%       105     6.7 / 16            4.4 / 34         4           2
    outlines    29%        89     68 / 513 (6 t/o)    7.3 / 153        4           2
    AUTO        39%       123     1.8 / 3.5           20 / 590         0           1
  xgrammar's 2: a ``patternProperties`` key pattern with ``.`` also matches ``"``, so a key can
  swallow ``":"bad","m.y`` and the value goes unchecked; the same holds for ``pattern`` (xgrammar
  and outlines accept ``{"s":"a","t":"x","t":1}`` for s ~ ``^a.+$``, t integer). outlines' 2:
  ``pattern`` dropped beside ``minLength``/``maxLength``; ``date-time`` without a time offset (the
  AUTO one: outlines is the only engine that compiles ``date-time``). Probes: xgrammar ignores
  ``minLength``/``maxLength`` beside ``pattern`` or ``format``.

Regex (15 everyday patterns) and choice (6 lists, 2-1,000 options), bench/maskbench.py --kinds
    regex   compile p50/p90 ms  mask p50/p99 µs     choice  compile p50/p90 ms  mask p50/p99 µs
    llg     2.2 / 3.4           39 / 853                    2.2 / 9.9           26 / 149
    xgr     0.9 / 480           9.4 / 18,900                0.5 / 14            2.7 / 21
    outl    20 / 1,017          16 / 99                     11 / 99             5.2 / 35
  All three rejected every non-matching string; outlines-core also rejected valid ones (3 regex,
  2 choice: a token from an accepting state into a non-accepting one is never allowed, e.g.
  ``-12.5`` for a number regex, ``ab`` among ``a|ab|abc``). xgrammar's tails (three runs):
  ``[^\n]{1,200}`` compiles in 2.6-6.6 s, ``[a-z]{1,300}`` in 0.5-1.2 s, and ``(\w+ ){2,5}\w+``
  masks take 16-44 ms per token; llguidance compiled every regex in 2-30 ms. Choice compile by
  list size (xgrammar vs llguidance, in-process): 10 options 2.1 vs 2.1 ms, 100: 7.9 vs 2.9,
  1,000: 96 vs 21, 5,000: 812 vs 115 ms. Mask times of either engine are three orders of
  magnitude below a decode step (~74 ms on this CPU), so compile time (time to first token) and
  its tail decide.

Hence:

* JSON Schema: llguidance first (sound on both benches, most coverage, fastest compile; it
  refuses what it does not implement), then xgrammar (fastest masks; under-constrained on
  MaskBench before its guard conditions, so after llguidance), then the validated fallback on
  llguidance (``FALLBACK``). outlines only when named.
* Regex: llguidance, xgrammar, outlines: equally sound on the set; llguidance's compile stays
  in milliseconds where xgrammar's bounded repetitions take seconds (past the server's 5 s
  limit); outlines over-constrains and compiles slowest.
* Choice: llguidance, xgrammar, outlines: both sound; xgrammar masks faster, but its compile time
  grows much faster with the number of options (7× llguidance's at 5,000); outlines
  over-constrains prefixes.
* Lark grammars: llguidance only. EBNF (GBNF): xgrammar (native) then llguidance (via
  ``gbnf_to_lark``).
"""

from __future__ import annotations

from proctor.constraints.engines import CHOICE, EBNF, ENGINES, JSON, LARK, LLGUIDANCE, OUTLINES, REGEX, XGRAMMAR
from proctor.constraints.spec import ConstraintKind, ConstraintSpec, GrammarSyntax

ORDER: dict[str, tuple[str, ...]] = {
    JSON: (LLGUIDANCE, XGRAMMAR),  # then the validated fallback (FALLBACK); outlines only when named
    REGEX: (LLGUIDANCE, XGRAMMAR, OUTLINES),
    CHOICE: (LLGUIDANCE, XGRAMMAR, OUTLINES),
    LARK: (LLGUIDANCE,),
    EBNF: (XGRAMMAR, LLGUIDANCE),
}

# The validated fallback (a JSON schema no engine enforces exactly): its relaxed superset is
# compiled by this engine — llguidance, which was sound on both benches and refuses what it does
# not implement, so the superset it is given is the superset it enforces.
FALLBACK: dict[str, str] = {JSON: LLGUIDANCE}
# AUTO only names engines that implement the row they are listed in.
assert all(kind in ENGINES[name].kinds for kind, names in ORDER.items() for name in names)


def policy_key(spec: ConstraintSpec) -> str:
    """The row of ``ORDER`` for ``spec``: its kind, and for grammars the syntax."""
    if spec.kind is ConstraintKind.GRAMMAR:
        return f"grammar:{(spec.syntax or GrammarSyntax.LARK).value}"
    return str(spec.kind.value)


def backend_order(spec: ConstraintSpec) -> tuple[str, ...]:
    """Engines to try for ``spec``, best first; the caller falls back to the next on refusal."""
    return ORDER[policy_key(spec)]
