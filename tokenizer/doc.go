// Package tokenizer loads a Hugging Face model's tokenizer.json (and tokenizer_config.json) and
// encodes text to exactly the token ids Hugging Face's Rust tokenizers (and so vLLM and SGLang)
// produce: byte-level BPE (Llama-3, Qwen, DeepSeek) and SentencePiece-style BPE with byte fallback
// (Llama-2, Mistral, Gemma 3), with HF's merge order (lowest rank, then leftmost), ignore_merges, the NFC,
// Prepend, Replace and Sequence normalizers, the Split, ByteLevel, Metaspace and Sequence
// pre-tokenizers, added tokens with their lstrip/rstrip/normalized/single_word flags, the
// TemplateProcessing and ByteLevel post-processors, and transformers' add_bos_token/add_eos_token
// override from tokenizer_config.json. A file that uses anything else is refused at load with an
// error naming the feature (ErrUnsupported): it never tokenizes approximately. Unicode follows
// HF's core, not Go's: regex classes from Unicode 16.0.0 (Oniguruma's tables) and NFC from
// Unicode 9.0.0 without the stream-safe step (unicode.go, nfc.go).
//
// Text between added tokens is tokenized independently, so Encode memoizes the ids of long
// segments (bounded by SegmentCacheBytes): the next turn of a chat re-tokenizes only what is new.
// Chat templates are rendered by the sibling package tokenizer/chat.
package tokenizer
