// The text corpus of the golden tests. Fixed strings cover the cases that break
// tokenizers; a seeded generator adds strings drawn from a pool of tricky characters.
const fixed = [
  "", "Hello, world!", "  multiple   spaces\n\n\tand tabs", "naïve café 123456 ﬁ",
  "<|im_start|>user\nHi<|im_end|>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>", "<s>[INST] Hi [/INST]</s>", "<think>\nhmm\n</think>\n\nok",
  " <|im_end|> spaced <|im_end|>", "<|im_sta", "<|endoftext|><|endoftext|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "def f(x):\n    return x**2  # comment\n", "I'm sure they'll've done it, DON'T, WE'RE, it'S", "’s ‘quoted’ “double”",
  "Price: $1,234.56 (approx.) 2024-05-01", "1234567890123", "12 345 6789 0", "½ ² ³ ① Ⅻ ٣٤٥ ३४५",
  "東京タワーは高い。中文测试，标点！", "한국어 텍스트입니다", "ภาษาไทยไม่มีช่องว่าง", "العربية هنا", "हिन्दी में लिखा",
  "emoji 🙂🚀👨‍👩‍👧 test", "flags 🇫🇷🇯🇵 skin 👍🏽 vs ✌️", "e\u0301 vs \u00e9 (NFD vs NFC)", "Ångström A\u030angstro\u0308m",
  "한\u1100\u1161 jamo", "trailing spaces   ", "\n\n\n", " leading space", "a\r\nb\r\n", "\r\n\r\n  \r\n",
  "Ünïcödé ß ﬀ Ⅻ ①", "nbsp\u00a0here\u00a0\u00a0two", "ideographic\u3000space", "line\u2028sep\u2029para",
  "zero\u200bwidth\u200djoiner", "tab\tsep\tvalues\t", "\t\t\t", "    ", " ", "\n",
  "x".repeat(300), "ab".repeat(500), " ".repeat(100), "\n".repeat(50), "=".repeat(80), "😀".repeat(40),
  "The quick brown fox jumps over the lazy dog. ".repeat(30), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbb",
  "ſ 'ſ K Kelvin 'K", "MiXeD CaSe 'LL 'Ve 'D 'M", "https://example.com/path?q=1&r=2#frag", "user@example.com",
  "{\"key\": [1, 2, {\"n\": null}], \"t\": true}", "<html><body><p class=\"x\">hi</p></body></html>",
  "SELECT * FROM t WHERE a = 'b';", "$$\\int_0^1 x^2 dx = \\frac{1}{3}$$", "../../etc/passwd", "C:\\Users\\x",
  "Straße STRASSE", "İstanbul ıi", "ΑΒΓ αβγ ς σ", "Кириллица текст", "mixed中文English日本語한국어",
  "word<think>word", "a  <think>  b", "\n <think> \n x", "x</think>y", "x </think> y", "</think>", "é</think>",
  "<tool_call><tool_call>", "  <|im_start|>  <|im_end|>  \n", "<|im_end|>\n\n<|im_start|>", "<s> </s>  <s>",
  "\u0000nul\u0001ctl\u007fdel", "\ufeffbom", "\ufffdreplacement", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛", "a\u0300\u0301\u0302\u0303 stacked",
];

// mulberry32: a small seeded PRNG so the corpus is the same on every run.
function prng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pool = [..."aeiou tnsrl AETNS 0123456789 .,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`"].concat(
  [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'ll", "'T", "é", "e\u0301", "ß", "中", "文", "の", "ア", "한",
   "🙂", "👨‍👩‍👧", "\u00a0", "\u3000", "١", "²", "ﬁ", "<|im_end|>", "<|eot_id|>", "<think>", "<s>", "</s>", "<|", "|>",
   "<｜end▁of▁sentence｜>", "▁", "Ġ", "Hello", "world", " the", "1234", "\u200d"]);

export function corpus() {
  const r = prng(12);
  const out = [...fixed];
  for (let i = 0; i < 250; i++) {
    const n = 1 + Math.floor(r() * 40);
    let s = "";
    for (let j = 0; j < n; j++) s += pool[Math.floor(r() * pool.length)];
    out.push(s);
  }
  // one long mixed document (~20 KB)
  let doc = "";
  for (let i = 0; i < 400; i++) doc += fixed[4 + Math.floor(r() * (fixed.length - 4))] + (r() < 0.3 ? "\n" : " ");
  out.push(doc);
  return out;
}
