# Renders the chat goldens' prompts with Python Jinja2 (Debian python3-jinja2) in Hugging Face's
# environment, after the message handling vLLM applies to a chat request.
# Run with Debian's interpreter:  /usr/bin/python3 tokenizer/testdata/gen/render.py OUT.json
# Sources: transformers' chat template environment (ImmutableSandboxedEnvironment with
# trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False),
# raise_exception, strftime_now) and continue_final_message handling; vLLM
# entrypoints/chat_utils.py (_parse_chat_message_content, _postprocess_messages) and the
# ChatCompletionRequest defaults (add_generation_prompt=True, add_special_tokens=False,
# tools = [tool.model_dump()]: FunctionDefinition{name, description=None, parameters=None}).
import json, math, re, sys
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.exceptions import TemplateError

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def raise_exception(m):
    raise TemplateError(m)

def strftime_now(fmt):
    return "26 Jul 2024"  # fixed: goldens must not depend on the day (the Go test sets the same)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

def tok_str(v):
    if v is None: return None
    return v if isinstance(v, str) else v.get("content")

# vLLM's "auto" content format: "openai" (content stays a list of parts) when the template loops
# over message content, else "string". vLLM walks the template AST; the Go side and this script
# match the same loops in the source.
CONTENT_LOOP = re.compile(r"for\s+\w+\s+in\s+\w+\s*(\.content|\[\s*['\"]content['\"]\s*\])")

# The part types vLLM reads as text and the key holding it (chat_utils.py MM_PARSER_MAP,
# _parse_chat_message_content_part): a text or refusal part without content is skipped, and
# the "string" format keeps only non-empty texts (`if parse_res:`).
TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}

def parse_message(m, parts_format=False):
    role = m["role"]
    content = m.get("content")
    if content is None: parts = []
    elif isinstance(content, str): parts = [{"type": "text", "text": content}]
    else: parts = content
    texts = []
    for p in parts:
        if isinstance(p, str): texts.append(p); continue
        typ = p.get("type")
        if typ not in TEXT_KEYS: raise ValueError("unsupported part " + str(typ))
        t = p.get(TEXT_KEYS[typ])
        if t is None and typ in ("text", "refusal"): continue
        texts.append(t)
    out = {"role": role, "content": [{"type": "text", "text": t} for t in texts] if parts_format else "\n".join(t for t in texts if t)}
    if role == "assistant" and m.get("tool_calls") is not None:
        out["tool_calls"] = list(m["tool_calls"])
    elif role == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    if role == "assistant":
        r = m.get("reasoning") or m.get("reasoning_content")
        if r is not None:
            out["reasoning"] = r
            out["reasoning_content"] = r
    return out

def postprocess(msgs):
    for m in msgs:
        if m["role"] == "assistant" and isinstance(m.get("tool_calls"), list):
            if not m["tool_calls"]:
                del m["tool_calls"]
                continue
            for item in m["tool_calls"]:
                a = item["function"].get("arguments")
                if a:
                    if not isinstance(a, (dict, list)):
                        try: item["function"]["arguments"] = json.loads(a)
                        except ValueError: item["function"]["arguments"] = {}
                else:
                    item["function"]["arguments"] = {}

def dump_tool(t):
    f = t["function"]
    fd = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
    for k, v in f.items():
        if k not in fd: fd[k] = v
    out = {"type": t.get("type", "function"), "function": fd}
    for k, v in t.items():
        if k not in out: out[k] = v
    return out

def render(cfg, req):
    tmpl_src = cfg["chat_template"]
    t = env.from_string(tmpl_src)
    parts_format = bool(CONTENT_LOOP.search(tmpl_src))
    msgs = [parse_message(m, parts_format) for m in req["messages"]]
    postprocess(msgs)
    tools = None if req.get("tools") is None else [dump_tool(x) for x in req["tools"]]
    agp = req.get("add_generation_prompt", True)
    cont = req.get("continue_final_message", False)
    if agp and cont:
        raise ValueError("cannot set both add_generation_prompt and continue_final_message")
    kw = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = tok_str(cfg.get(k))
        if v is not None: kw[k] = v
    kw.update(req.get("chat_template_kwargs") or {})
    s = t.render(messages=msgs, tools=tools, documents=req.get("documents"), add_generation_prompt=agp, **kw)
    if cont:
        final = msgs[-1]["content"]
        if isinstance(final, list):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    break
            else:
                raise ValueError("continue_final_message: no text to continue in the final message")
        if final.strip() not in s:
            raise ValueError("continue_final_message: final message not in the rendered chat")
        loc = s.rindex(final.strip())
        if s[loc:loc + len(final.lstrip())] == final:
            s = s[:loc + len(final.lstrip())]
        else:
            s = s[:loc + len(final.strip())]
    return s

def request_json(req):
    # The request as standard JSON for the goldens (gen_chat.mjs copies it verbatim): numbers as
    # json.load read them, a float past the range (1e400 read as inf) written back as 1e400.
    def prep(o):
        if isinstance(o, float) and math.isinf(o): return "\x00INF" + ("-" if o < 0 else "+")
        if isinstance(o, float) and math.isnan(o): raise ValueError("NaN outside a string")
        if isinstance(o, dict): return {k: prep(v) for k, v in o.items()}
        if isinstance(o, list): return [prep(v) for v in o]
        return o
    s = json.dumps(prep(req), ensure_ascii=False)
    return s.replace('"\\u0000INF+"', "1e400").replace('"\\u0000INF-"', "-1e400")

if __name__ == "__main__":
    cases = json.load(open("tokenizer/testdata/gen/chats.json"))
    out = {"requests": [{"name": c["name"], "request_json": request_json(c["request"]),
                         "add_special_tokens": bool(c["request"].get("add_special_tokens"))} for c in cases]}
    for model in ["llama3", "llama3_1", "qwen3", "deepseek_v3", "gemma3"]:
        cfg = json.load(open(f".cache/tokenizers/{model}/tokenizer_config.json"))
        res = []
        for c in cases:
            try:
                res.append({"name": c["name"], "rendered": render(cfg, c["request"])})
            except Exception as e:
                res.append({"name": c["name"], "error": f"{type(e).__name__}: {e}"})
        out[model] = res
    json.dump(out, open(sys.argv[1], "w"), ensure_ascii=False)
    print("rendered", sum(len(v) for k, v in out.items() if k != "requests"))
