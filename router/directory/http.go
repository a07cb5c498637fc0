package directory

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/local"
)

// The HTTP codec, in the shape of Mooncake Conductor's indexer API (kvcache-ai/Mooncake,
// docs/source/api-reference/http/conductor-indexer.md):
//
//	POST /query          {"model", "lora_name"?, "lora_id"?, "token_ids", "tenant_id"?, "instance_id"?, "block_size", "cache_salt"?}
//	POST /query_by_hash  the same with "seq_hashes" (or the older "block_hash") instead of "token_ids"
//	→ {"<tenant_id>": {"<node>": {"longest_matched": n, "GPU": n, "CPU": n, "DISK": n, "STORAGE": n, "REMOTE": n}}}
//
// Differences, all documented for clients: seq_hashes are prefixmesh's canonical block hashes
// (xxhash64 chained per block, docs/architecture.md), not Mooncake's XXH3 rolling hashes; a
// node's data-parallel ranks are one summary, so there is no "DP" map; a non-empty cache_salt
// matches nothing (salted blocks are never in the index), so every node answers 0.

// MaxQueryBytes bounds a query's body: a prompt at the token cap written as JSON numbers.
const MaxQueryBytes = 8 << 20

// queryBody is the JSON of both endpoints.
type queryBody struct {
	Model      string   `json:"model"`
	LoRAName   string   `json:"lora_name"`
	LoRAID     *uint64  `json:"lora_id"`
	TokenIDs   []uint32 `json:"token_ids"`
	SeqHashes  []uint64 `json:"seq_hashes"`
	BlockHash  []uint64 `json:"block_hash"`
	TenantID   string   `json:"tenant_id"`
	InstanceID string   `json:"instance_id"`
	BlockSize  int      `json:"block_size"`
	CacheSalt  string   `json:"cache_salt"`
}

// Handler serves POST /query and POST /query_by_hash. Admission, the listener's trust rule and
// body budget are the caller's (it is mounted on a door that has them); the handler bounds the
// body it reads at MaxQueryBytes.
func (d *Directory) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /query", func(w http.ResponseWriter, r *http.Request) { d.serve(w, r, false) })
	mux.HandleFunc("POST /query_by_hash", func(w http.ResponseWriter, r *http.Request) { d.serve(w, r, true) })
	return mux
}

var scratchPool = sync.Pool{New: func() any { return new(Scratch) }}

func (d *Directory) serve(w http.ResponseWriter, r *http.Request, byHash bool) {
	var body queryBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxQueryBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			openai.WriteError(w, &openai.Error{Status: http.StatusRequestEntityTooLarge, Code: openai.CodePromptTooLong,
				Message: "query body is over " + strconv.Itoa(MaxQueryBytes) + " bytes"})
			return
		}
		openai.WriteError(w, openai.Invalid("", "query body is not a JSON object of the query's fields: %v", err))
		return
	}
	if dec.More() || dec.Decode(new(json.RawMessage)) != io.EOF {
		openai.WriteError(w, openai.Invalid("", "query body has data after its JSON object"))
		return
	}
	q, err := body.query(byHash)
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	sc := scratchPool.Get().(*Scratch)
	defer scratchPool.Put(sc)
	matches, lerr := d.Lookup(q, sc)
	if lerr != nil {
		openai.WriteError(w, openai.Invalid("", "%v", lerr))
		return
	}
	salted := body.CacheSalt != ""
	tenant := body.TenantID
	if tenant == "" {
		tenant = "default"
	}
	out := appendAnswer(nil, tenant, matches, salted)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out) // the client may be gone
}

// query checks the body's fields and turns it into a Query; errors name the field at fault.
func (b *queryBody) query(byHash bool) (*Query, *openai.Error) {
	q := &Query{Model: b.Model, LoRA: b.LoRAName, BlockSize: b.BlockSize, Instance: b.InstanceID}
	switch {
	case b.Model == "":
		return nil, openai.Invalid("model", "model is required")
	case b.BlockSize <= 0 || b.BlockSize > 1<<16:
		return nil, openai.Invalid("block_size", "block_size %d must be between 1 and 65536", b.BlockSize)
	case b.LoRAID != nil && b.LoRAName != "":
		return nil, openai.Invalid("lora_id", "give lora_name or lora_id, not both")
	}
	if b.LoRAID != nil {
		q.LoRA = strconv.FormatUint(*b.LoRAID, 10) // a decimal name is that adapter id (local.AdapterIDOf)
	}
	if byHash {
		if b.TokenIDs != nil {
			return nil, openai.Invalid("token_ids", "query_by_hash takes seq_hashes, not token_ids")
		}
		hashes := b.SeqHashes
		if hashes == nil {
			hashes = b.BlockHash
		} else if b.BlockHash != nil {
			return nil, openai.Invalid("block_hash", "give seq_hashes or block_hash, not both")
		}
		if hashes == nil {
			return nil, openai.Invalid("seq_hashes", "seq_hashes is required")
		}
		if len(hashes) > MaxHashes {
			return nil, openai.Invalid("seq_hashes", "%d seq_hashes is more than %d", len(hashes), MaxHashes)
		}
		q.Hashes = hashes
		return q, nil
	}
	if b.SeqHashes != nil || b.BlockHash != nil {
		return nil, openai.Invalid("seq_hashes", "query takes token_ids; use /query_by_hash for hashes")
	}
	if b.TokenIDs == nil {
		return nil, openai.Invalid("token_ids", "token_ids is required")
	}
	if err := openai.CheckPromptTokens(len(b.TokenIDs)); err != nil {
		var oe *openai.Error
		if errors.As(err, &oe) {
			oe.Param = "token_ids"
			return nil, oe
		}
		return nil, openai.Invalid("token_ids", "%v", err)
	}
	q.Tokens = b.TokenIDs
	return q, nil
}

// mediumNames are the answer's keys per tier: Mooncake's GPU, CPU and DISK, then prefixmesh's
// storage and remote tiers in the same style.
var mediumNames = [local.NumTiers]string{"GPU", "CPU", "DISK", "STORAGE", "REMOTE"}

// appendAnswer writes {"tenant": {"node": {...}, ...}} for matches; salted answers are zeros.
func appendAnswer(b []byte, tenant string, matches []Match, salted bool) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	str := func(s string) {
		buf.Reset()
		_ = enc.Encode(s) // a string always encodes
		b = append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
	}
	b = append(b, '{')
	str(tenant)
	b = append(b, ":{"...)
	for i, m := range matches {
		if salted {
			m = Match{Node: m.Node}
		}
		if i > 0 {
			b = append(b, ',')
		}
		str(m.Node)
		b = append(b, `:{"longest_matched":`...)
		b = strconv.AppendInt(b, int64(m.Longest), 10)
		for t, name := range mediumNames {
			b = append(b, ",\""...)
			b = append(b, name...)
			b = append(b, "\":"...)
			b = strconv.AppendInt(b, int64(m.Prefix[t]), 10)
		}
		b = append(b, '}')
	}
	return append(b, "}}\n"...)
}
