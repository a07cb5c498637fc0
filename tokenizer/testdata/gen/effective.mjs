// transformers' post-processor override (TokenizersBackend.update_post_processor): when
// tokenizer_config.json has add_bos_token or add_eos_token, the post-processor becomes
// TemplateProcessing "[bos:0] $A:0 [eos:0]" with the flags that are true.
function tokStr(v) { return v == null ? '' : (typeof v === 'string' ? v : v.content); }

export function effective(tj, cfg) {
  if (!('add_bos_token' in cfg) && !('add_eos_token' in cfg)) return tj;
  const vocab = tj.model.vocab;
  const idOf = (t) => { const a = tj.added_tokens.find((x) => x.content === t); return a ? a.id : vocab[t]; };
  const single = [], specials = {};
  const bos = tokStr(cfg.bos_token), eos = tokStr(cfg.eos_token);
  if (cfg.add_bos_token) { single.push({ SpecialToken: { id: bos, type_id: 0 } }); specials[bos] = { id: bos, ids: [idOf(bos)], tokens: [bos] }; }
  single.push({ Sequence: { id: 'A', type_id: 0 } });
  if (cfg.add_eos_token) { single.push({ SpecialToken: { id: eos, type_id: 0 } }); specials[eos] = { id: eos, ids: [idOf(eos)], tokens: [eos] }; }
  const pair = [...single, { Sequence: { id: 'B', type_id: 1 } }];
  return { ...tj, post_processor: { type: 'TemplateProcessing', single, pair, special_tokens: specials } };
}

