// Times Hugging Face's Rust tokenizers (npm tokenizers@0.23.2) on the corpus the Go benchmarks
// use, so both are measured in the same run on the same text. Run from the repository
// root, pinned to one core like the Go side:
//   taskset -c 0 node tokenizer/testdata/bench/bench.mjs
// It prints, per model and text, tokens, ms per encode and MB/s (best of a few rounds).
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';
const require = createRequire(path.resolve('.cache/tokenizers/node_modules/x.js'));
const { Tokenizer } = require('tokenizers');

function sized(file, bytes) {
  const b = fs.readFileSync(file, 'utf8');
  let s = b;
  while (Buffer.byteLength(s) < bytes) s += b;
  // cut at a space, like the Go side (bytes, not UTF-16 units)
  const buf = Buffer.from(s).subarray(0, bytes);
  return buf.subarray(0, buf.lastIndexOf(0x20) + 1).toString('utf8');
}

const texts = {
  corpus32k: sized('tokenizer/testdata/bench/corpus.txt', 32 << 10),
  adversarial32k: sized('tokenizer/testdata/bench/adversarial.txt', 32 << 10),
};
for (const m of ['llama3_1', 'qwen3', 'deepseek_v3', 'llama2', 'gemma3']) {
  const t = Tokenizer.fromFile(`.cache/tokenizers/${m}/tokenizer.json`);
  for (const [name, s] of Object.entries(texts)) {
    let ids = (await t.encode(s, null, { addSpecialTokens: false })).getIds().length;
    const N = 30;
    let best = Infinity;
    for (let round = 0; round < 5; round++) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < N; i++) await t.encode(s, null, { addSpecialTokens: false });
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6 / N);
    }
    const mb = Buffer.byteLength(s) / 1e6 / (best / 1e3);
    console.log(`hf-rust ${m} ${name} tokens=${ids} ${best.toFixed(3)} ms/op ${mb.toFixed(2)} MB/s`);
  }
}
