#!/usr/bin/env python3
"""Writes tests/fixtures/chat_templates/jinja2_semantics.json: what Jinja2 3.1 answers for every
test, filter, string/dict method and operator that chat templates use, applied to None, to
undefined values (an unknown variable, a missing key) and to ordinary values, each as a one-line
template rendered through transformers' own `render_jinja_template` (the sandboxed environment,
`trim_blocks`/`lstrip_blocks`, loop controls and transformers' `tojson`). tests/chat_template_corpus.rs
renders every row through Deltafin and compares: same text, or a failure where Jinja2 raises.

Pinned: transformers==5.24.0, jinja2==3.1.6 (no torch needed). Run from the repository root:

    python3 -m venv /tmp/venv-tf && /tmp/venv-tf/bin/pip install transformers==5.24.0 jinja2==3.1.6
    /tmp/venv-tf/bin/python tools/reference/jinja2_semantics.py

Each row is `[template, output, error]`: `output` is the rendered text (null when it raised),
`error` the exception's class name (null when it rendered).
"""
import json
import os

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

assert transformers.__version__ == "5.24.0", transformers.__version__
assert jinja2.__version__ == "3.1.6", jinja2.__version__

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "chat_templates",
                   "jinja2_semantics.json")

# Template variables besides `messages` (empty), `tools` and `documents` (both None, as
# `apply_chat_template` passes them when not given) and `add_generation_prompt`. Values are
# variables, not literals, as in chat templates (Jinja2 folds operations on literals at compile time).
VARIABLES = {"n": None, "m": {"a": 1, "b": None, "s": "Ab"}, "rows": [{"a": 2, "b": "x"}, {"a": 1}, {"a": None, "b": "y"}],
             "s0": "", "s1": "ab", "s2": "Ab C", "i0": 0, "i3": 3, "f": -1.5, "yes": True, "no": False, "l0": [],
             "l1": [3, 1, 3], "l2": ["b", "a"], "d0": {}}

# None and undefined values, each reached the ways templates reach them.
NULLISH = ["tools", "n", "m.b", "nothing", "m.missing", "m['missing']", "rows[5]"]
ORDINARY = ["s0", "s1", "s2", "i0", "i3", "f", "yes", "no", "l0", "l1", "l2", "d0", "m", "rows"]

TESTS = ["defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string",
         "mapping", "sequence", "iterable", "callable", "lower", "upper", "odd", "even", "divisibleby(3)",
         "sameas(none)", "sameas(false)", "escaped", "in([1, none])", "in('abc')", "eq(none)", "equalto(3)",
         "ne(none)", "gt(0)", "lt(2)", "ge(0)", "le(2)", "greaterthan(0)", "lessthan(2)", "filter", "test"]

# Filters whose result is a generator (printed as an object address by Jinja2) are listed.
FILTERS = ["abs", "attr('a')", "batch(2) | list", "capitalize", "center(6)", "count", "default('x')", "d('x')",
           "default('x', true)", "dictsort", "escape", "e", "first", "float", "format", "groupby('a') | list",
           "indent(2)", "int", "items | list", "join", "join(',')", "last", "length", "list", "lower",
           "map('upper') | list", "map(attribute='a') | list", "max", "min", "reject('none') | list",
           "rejectattr('a') | list", "replace('a', 'z')", "reverse | list", "round", "safe", "select | list",
           "selectattr('a') | list", "selectattr('a', 'none') | list", "slice(2) | list", "sort",
           "sort(attribute='a')", "string", "sum", "title", "tojson", "tojson(indent=2)", "trim", "truncate(4)",
           "unique | list", "upper", "wordcount"]

METHODS = ["startswith('a')", "endswith('b')", "strip()", "split()", "lower()", "upper()", "replace('a', 'z')",
           "items() | list", "get('a')", "keys() | list", "values() | list"]

# `{V}` is replaced by the value's expression.
OPERATIONS = ["{{{{ {V} }}}}", "{{{{ {V} ~ '|' }}}}", "{{% if {V} %}}Y{{% else %}}N{{% endif %}}",
              "{{{{ not {V} }}}}", "{{{{ {V} == none }}}}", "{{{{ {V} != '' }}}}", "{{{{ {V} or 'd' }}}}",
              "{{{{ {V} and 'd' }}}}", "{{% for i in {V} %}}{{{{ i }}}},{{% endfor %}}",
              "{{% for i in {V} %}}{{{{ i }}}},{{% else %}}empty{{% endfor %}}", "{{{{ 'a' in {V} }}}}",
              "{{{{ {V} in ['', none] }}}}", "{{{{ {V} + 1 }}}}", "{{{{ {V} * 2 }}}}", "{{{{ {V} > 0 }}}}",
              "{{{{ {V}[0] }}}}", "{{{{ {V}[1:] }}}}", "{{{{ {V}.a }}}}", "{{{{ {V}['a'] }}}}",
              "{{{{ '%s' | format({V}) }}}}", "{{{{ [{V}] | tojson }}}}",
              "{{% if {V} is iterable and {V} | length > 0 %}}Y{{% else %}}N{{% endif %}}",
              "{{% if {V} is not none and {V} | length > 0 %}}Y{{% else %}}N{{% endif %}}",
              "{{% if {V} is defined and {V} %}}Y{{% else %}}N{{% endif %}}",
              "{{% set ns = namespace(v={V}) %}}{{{{ ns.v is none }}}}"]

# Values of other kinds: functions, macros, namespaces, the loop object, filter results.
OTHERS = ["{% if raise_exception is callable %}Y{% else %}N{% endif %}",
          "{% if strftime_now is callable %}Y{% else %}N{% endif %}",
          "{% macro f() %}{% endmacro %}{% if f is callable %}Y{% else %}N{% endif %}",
          "{% set ns = namespace(a=1) %}{% if ns is callable %}Y{% else %}N{% endif %}",
          "{% for x in [1] %}{% if loop is callable %}Y{% else %}N{% endif %}{% endfor %}",
          "{% if messages | map('upper') is iterable %}Y{% else %}N{% endif %}",
          "{% if messages | reverse is sequence %}Y{% else %}N{% endif %}"]
# Numbers read from text, with defaults and bases.
OTHERS += ["{{ x | int }}|{{ x | float }}".replace("x", repr(x)) for x in
           ["42", " -3.7 ", "1e3", "1_000", "_1", "+5", "inf", "nan", "0x1A", "3.", ".5", "1,5"]]
OTHERS += ["{{ 'ab' | int(7) }}", "{{ 'ab' | float(2.5) }}", "{{ 'ab' | float(default=-1.0) }}", "{{ '0x1A' | int(base=16) }}", "{{ '1A' | int(0, 16) }}",
           "{{ 7.9 | int }}", "{{ -7.9 | int }}", "{{ 'z' | int(base=36) }}"]


def templates():
    yield from OTHERS
    for v in NULLISH + ORDINARY:
        for t in TESTS:
            yield f"{{% if {v} is {t} %}}Y{{% else %}}N{{% endif %}}"
            if t in ("defined", "none", "string", "mapping", "iterable", "sequence"):
                yield f"{{% if {v} is not {t} %}}Y{{% else %}}N{{% endif %}}"
        for f in FILTERS:
            yield f"{{{{ {v} | {f} }}}}"
        for meth in METHODS:
            yield f"{{{{ {v}.{meth} }}}}"
        for op in OPERATIONS:
            yield op.format(V=v)


def render(src):
    try:
        out, _ = render_jinja_template(conversations=[[]], chat_template=src, tools=None, documents=None,
                                       add_generation_prompt=False, **VARIABLES)
        return [src, out[0], None]
    except Exception as e:  # the reference's failure is the expected result
        return [src, None, type(e).__name__]


def main():
    rows = [render(src) for src in templates()]
    doc = {"jinja2_version": jinja2.__version__, "transformers_version": transformers.__version__,
           "variables": VARIABLES, "rows": rows}
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k in ("jinja2_version", "transformers_version", "variables"):
            f.write(f'"{k}": {json.dumps(doc[k], ensure_ascii=False)},\n')
        f.write('"rows": [\n')
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
        f.write("\n]}\n")
    print(f"{len(rows)} rows, {sum(r[2] is not None for r in rows)} raise -> {OUT}")


if __name__ == "__main__":
    main()
