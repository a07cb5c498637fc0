# Generates tokenizer/testdata/golden/python.json: how Python prints what chat templates print,
# as the oracle of tokenizer/chat's Python printing (python.go) and template rewrite
# (rewrite.go). Run with Debian's interpreter and python3-jinja2, from the repository root:
#   /usr/bin/python3 tokenizer/testdata/gen/python.py
#  * floats: repr() and json.dumps() of floats given by their IEEE-754 bits (edge values and
#    a deterministic pseudo-random sample of bit patterns);
#  * isspace: every code point for which str.isspace() holds;
#  * snippets: small templates rendered in transformers' environment (render.py's) with
#    variables read by json.loads, including the tojson options and str() of containers.
import json, math, random, struct, sys
sys.path.insert(0, "tokenizer/testdata/gen")
from jinja2.exceptions import TemplateError

import render  # noqa: E402  (the HF environment; render.py renders the chats when run as main)

def bits(f): return "%016x" % struct.unpack("<Q", struct.pack("<d", f))[0]

edge = [0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 1.5, 2.0, 1e6, 1e-4, 1e-5, 1e15, 1e16, 1e17, 1e21, 1e22, 123456.7,
        1234567.5, 1733088000.5, 9007199254740993.0, 0.3333333333333333, 2.5e-8, 5e-324, 2.2250738585072014e-308,
        1.7976931348623157e308, float("inf"), float("-inf"), float("nan"), 100.0, 1e100, 123e-20, 0.001, 0.0001234]
rng = random.Random(22)
sample = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(300)]
sample += [rng.uniform(-1e7, 1e7) for _ in range(200)] + [float(rng.randint(-10**17, 10**17)) for _ in range(100)]
floats = []
for f in edge + sample:
    floats.append({"bits": bits(f), "repr": repr(f), "json": json.dumps(f)})

isspace = [c for c in range(0x110000) if chr(c).isspace()]

snippets = []
def snip(name, template, variables):
    src = json.dumps(variables)
    data = json.loads(src)
    try:
        out = render.env.from_string(template).render(**data)
        snippets.append({"name": name, "template": template, "vars": src, "rendered": out})
    except (TemplateError, TypeError, ValueError) as e:
        snippets.append({"name": name, "template": template, "vars": src, "error": type(e).__name__ + ": " + str(e)})

v = {"f": 1733088000.5, "one": 1.0, "n": None, "t": True, "i": 7, "s": "a'b\"c\u2028\u00e9\n\t\\",
     "lst": [1.5, "x", None, True, 2, {"k": 1.0}], "d": {"b": 1e22, "a": [0.1, -0.0]},
     "big": 18446744073709551616, "ctl": "\u001f hi \u001c", "q": "it's", "u": "\u00ad\u200b\U0001F600"}
snip("print-scalars", "{{ f }}|{{ one }}|{{ n }}|{{ t }}|{{ i }}|{{ s }}|{{ big }}", v)
snip("print-containers", "{{ lst }}|{{ d }}|{{ [q, s] }}|{{ {'u': u} }}", v)
snip("tojson-default", "{{ lst | tojson }}|{{ d | tojson }}|{{ s | tojson }}|{{ big | tojson }}", v)
snip("tojson-indent", "{{ d | tojson(indent=2) }}|{{ lst | tojson(indent=0) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson(indent='--') }}", v)
snip("tojson-options", "{{ d | tojson(sort_keys=true) }}|{{ s | tojson(ensure_ascii=true) }}|{{ u | tojson(ensure_ascii=true) }}|{{ d | tojson(separators=(',', ':')) }}", v)
snip("tojson-positional", "{{ s | tojson(true) }}|{{ d | tojson(false, 1) }}", v)
snip("string-filter", "{{ f | string }}|{{ one | string }}|{{ n | string }}|{{ lst | string }}|{{ (one | string) + 'x' }}", v)
snip("trim", "[{{ ctl | trim }}]|[{{ '  x\u3000' | trim }}]|[{{ 'xxhixx' | trim('x') }}]|[{{ one | trim }}]", v)
snip("in-tojson-loop", "{% for k, x in d.items() %}{{ k }}={{ x | tojson }};{% endfor %}", v)
snip("arith", "{{ f + 1 }}|{{ one * 3 }}|{{ i / 2 }}|{{ 0.1 + 0.2 }}", v)
snip("literal-floats", "{{ 1.0 }}|{{ 2.50 }}|{{ -0.0 }}|{{ 10.0 ** 20 }}", v)
snip("undefined-tojson", "{{ nothing | tojson }}", v)

json.dump({"oracle": "Debian python3 " + sys.version.split()[0] + " + python3-jinja2 " + __import__("jinja2").__version__,
           "floats": floats, "isspace": isspace, "snippets": snippets},
          open("tokenizer/testdata/golden/python.json", "w"), ensure_ascii=False)
print(len(floats), "floats,", len(isspace), "space characters,", len(snippets), "snippets")
