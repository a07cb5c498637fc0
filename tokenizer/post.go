package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor adds special tokens around an encoding when add_special_tokens is on.
type postProcessor interface {
	appendPrefix(dst []uint32) []uint32
	appendSuffix(dst []uint32) []uint32
}

// template is TemplateProcessing's single-sequence template: ids before and after $A.
type template struct{ prefix, suffix []uint32 }

func (t *template) appendPrefix(dst []uint32) []uint32 { return append(dst, t.prefix...) }
func (t *template) appendSuffix(dst []uint32) []uint32 { return append(dst, t.suffix...) }

func parsePost(raw json.RawMessage, tk *Tokenizer) (postProcessor, error) {
	typ, err := typedKind(raw, "post_processor")
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return nil, nil // offsets only; no ids
	case "TemplateProcessing":
		var p struct {
			Single []struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			} `json:"single"`
			SpecialTokens map[string]struct {
				IDs []uint32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		t := &template{}
		seen := false
		for i, it := range p.Single {
			switch {
			case it.Sequence != nil:
				if seen || it.Sequence.ID != "A" {
					return nil, unsupported("TemplateProcessing single template with sequence %q at %d", it.Sequence.ID, i)
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := p.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing: special token %q has no ids", it.SpecialToken.ID)
				}
				if seen {
					t.suffix = append(t.suffix, st.IDs...)
				} else {
					t.prefix = append(t.prefix, st.IDs...)
				}
			default:
				return nil, fmt.Errorf("TemplateProcessing: single[%d] is neither SpecialToken nor Sequence", i)
			}
		}
		if !seen {
			return nil, fmt.Errorf("TemplateProcessing: single template without $A")
		}
		return t, nil
	case "Sequence":
		var p struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		// Each processor wraps the previous result: later prefixes go first, later suffixes last.
		out := &template{}
		for i, c := range p.Processors {
			pp, err := parsePost(c, tk)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if pp == nil {
				continue
			}
			pt := pp.(*template)
			out.prefix = append(append([]uint32{}, pt.prefix...), out.prefix...)
			out.suffix = append(out.suffix, pt.suffix...)
		}
		if len(out.prefix) == 0 && len(out.suffix) == 0 {
			return nil, nil
		}
		return out, nil
	}
	return nil, unsupported("post_processor %q", typ)
}

// overridePost applies transformers' rule: when tokenizer_config.json has add_bos_token or
// add_eos_token, the post-processor is replaced by TemplateProcessing "[bos] $A [eos]" with the
// flags that are true (transformers TokenizersBackend.update_post_processor; the v4 fast Llama
// tokenizer does the same). DeepSeek-V3's tokenizer.json has no BOS in its post-processor, but
// its config says add_bos_token: true, so HF and vLLM add one on completions.
func (t *Tokenizer) overridePost(addBOS, addEOS *bool) error {
	if addBOS == nil && addEOS == nil {
		return nil
	}
	tp := &template{}
	if addBOS != nil && *addBOS {
		id, ok := t.TokenID(t.bos)
		if t.bos == "" || !ok {
			return fmt.Errorf("add_bos_token is true but bos_token %q is not a token", t.bos)
		}
		tp.prefix = []uint32{id}
	}
	if addEOS != nil && *addEOS {
		id, ok := t.TokenID(t.eos)
		if t.eos == "" || !ok {
			return fmt.Errorf("add_eos_token is true but eos_token %q is not a token", t.eos)
		}
		tp.suffix = []uint32{id}
	}
	t.post = tp
	return nil
}
