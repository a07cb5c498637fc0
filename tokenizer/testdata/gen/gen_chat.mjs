// Generates tokenizer/testdata/golden/chat_<model>.json: the chat requests of
// chats.json, their prompts as Python Jinja2 renders them (render.py's output, argument 1), and
// the ids HF's Rust tokenizers (npm tokenizers@0.23.2) gives those prompts with the request's
// add_special_tokens (default false, as vLLM's chat path). Run from the repository root:
//   /usr/bin/python3 tokenizer/testdata/gen/render.py /tmp/rendered.json
//   node tokenizer/testdata/gen/gen_chat.mjs /tmp/rendered.json
import { createRequire } from 'module';
import fs from 'fs';
import os from 'os';
import path from 'path';
import { effective } from './effective.mjs';
const require = createRequire(path.resolve('.cache/tokenizers/node_modules/x.js'));
const { Tokenizer } = require('tokenizers');

// The requests come from render.py as JSON text and are copied into the goldens verbatim:
// JavaScript numbers would lose integers beyond 2^53.
const rendered = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const cases = rendered.requests;
delete rendered.requests;
for (const [m, res] of Object.entries(rendered)) {
  const dir = path.join('.cache/tokenizers', m);
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const tmp = path.join(os.tmpdir(), `pm-tok-${m}-${process.pid}.json`);
  fs.writeFileSync(tmp, JSON.stringify(effective(JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')), cfg)));
  const tok = Tokenizer.fromFile(tmp);
  fs.unlinkSync(tmp);
  const out = [];
  for (let i = 0; i < cases.length; i++) {
    const r = res[i];
    const c = { name: cases[i].name, request: `\u0000REQ${i}` };
    if (r.error !== undefined) { c.error = r.error; out.push(c); continue; }
    c.rendered = r.rendered;
    c.ids = (await tok.encode(r.rendered, null, { addSpecialTokens: cases[i].add_special_tokens })).getIds();
    out.push(c);
  }
  const text = JSON.stringify({ model: m, oracle: 'python3-jinja2 + npm tokenizers@0.23.2', cases: out })
    .replace(/"\\u0000REQ(\d+)"/g, (_, i) => cases[Number(i)].request_json);
  fs.writeFileSync(`tokenizer/testdata/golden/chat_${m}.json`, text + '\n');
  console.log(m, out.length, 'chat cases');
}
