package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// mountRoot is where the pods see their Secrets and ConfigMap.
const mountRoot = "/etc/prefixmesh/"

// materialise rewrites the pod paths under mountRoot in lines to root/etc/prefixmesh/… and
// creates there what the pods would have mounted: a gossip key and a self-signed TLS pair that
// parse, so --validate-only can check the files the flags name.
func materialise(lines []string, root string) ([]string, error) {
	if root == "" {
		return lines, nil
	}
	base := filepath.Join(root, "etc", "prefixmesh")
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.ReplaceAll(l, mountRoot, base+"/")
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	tokJSON, err := byteLevelTokenizer()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"gossip/gossip.key": []byte(base64.StdEncoding.EncodeToString(key) + "\n"),
		"tls/tls.crt":       certPEM,
		"tls/tls.key":       keyPEM,
		"tls/ca.crt":        certPEM,
		"ext-proc/ca.crt":   certPEM,
		// A byte-level BPE tokenizer with only the 256 byte symbols: enough for the router to
		// load hf:/etc/prefixmesh/tokenizer in --validate-only.
		"tokenizer/tokenizer.json":        tokJSON,
		"tokenizer/tokenizer_config.json": []byte("{}\n"),
	}
	for name, data := range files {
		p := filepath.Join(base, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func selfSigned() (certPEM, keyPEM []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "chartcheck"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, nil, err
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), nil
}

// byteLevelTokenizer returns a Hugging Face tokenizer.json whose vocabulary is GPT-2's byte
// alphabet (bytes_to_unicode in openai/gpt-2 src/encoder.py: printable Latin-1 bytes map to
// themselves, the other 68 to U+0100 onwards) and which has no merges.
func byteLevelTokenizer() ([]byte, error) {
	vocab := map[string]int{}
	n := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		vocab[string(r)] = b
	}
	bl := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	doc := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": []any{}, "normalizer": nil,
		"pre_tokenizer": bl, "post_processor": nil, "decoder": bl,
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []any{}},
	}
	return json.Marshal(doc)
}
