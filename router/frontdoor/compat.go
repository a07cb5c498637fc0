package frontdoor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/buildinfo"
	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// What clients written for vLLM call besides generation: GET /v1/models/{id}, /health,
// /version, and /tokenize and /detokenize (passed through to a healthy node's engine, the
// authority on its vocabulary); optional CORS; and no bare redirects (Go's ServeMux answers an
// unclean path with a 301 that drops a POST's body).

// passthroughTimeout bounds a /tokenize or /detokenize pass-through: tokenising the largest body
// takes milliseconds on an engine; 30 s leaves room for a loaded one.
const passthroughTimeout = 30 * time.Second

type modelJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) serveModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !slices.Contains(s.svc.Models(), id) {
		openai.WriteError(w, &openai.Error{Status: http.StatusNotFound, Code: codeModelNotFound, Param: "model",
			Message: fmt.Sprintf("model %q does not exist", id)})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(modelJSON{ID: id, Object: "model", Created: s.created, OwnedBy: "prefixmesh"})
}

// serveHealth is vLLM's /health: 200 with an empty body, 503 (Retry-After) while draining.
func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	if s.svc.Draining() {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusServiceUnavailable, codeDraining, "the router is shutting down")
		return
	}
	w.WriteHeader(http.StatusOK)
}

// serveVersion is vLLM's /version: {"version": …}, the router binary's version
// (internal/buildinfo: module version, else the VCS stamp of go build).
func (s *Server) serveVersion(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"version": buildinfo.Version()})
}

// servePassthrough forwards /tokenize or /detokenize to a healthy node serving the body's model
// (any node when it names none), trying a second node if the first cannot be reached.
func (s *Server) servePassthrough(w http.ResponseWriter, r *http.Request) {
	if err := openai.CheckJSON(r.Header); err != nil {
		s.writeErr(w, err, &reqLog{})
		return
	}
	// Pass-throughs share the generation requests' in-flight bound.
	if err := s.svc.Enter(); err != nil {
		if errors.Is(err, requests.ErrDraining) {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusServiceUnavailable, codeDraining, "the router is shutting down; retry on another replica")
			return
		}
		writeError(w, http.StatusTooManyRequests, codeOverloaded, fmt.Sprintf("the router has %d requests in flight, its limit; retry later", s.svc.MaxInFlight()))
		return
	}
	defer s.svc.Leave()
	rb, err := s.readBodyTimed(w, r)
	if err != nil {
		s.bodyError(w, err)
		return
	}
	defer rb.release()
	body := rb.b
	var m struct {
		Model string `json:"model"`
	}
	if err := openai.Decode(body, &m); err != nil {
		s.writeErr(w, err, &reqLog{})
		return
	}
	nodes := s.svc.Nodes()
	if nodes == nil {
		writeError(w, http.StatusServiceUnavailable, codeNoNodes, "this router has no node list to pass "+r.URL.Path+" to")
		return
	}
	// A model no node serves is a 404, as on the completions endpoints and as vLLM answers it
	// (OpenAIServing._check_model in vllm/entrypoints/openai/serving_engine.py), not a 503.
	if err := s.svc.KnownModel(m.Model); err != nil {
		s.writeErr(w, err, &reqLog{})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), passthroughTimeout)
	defer cancel()
	tried := 0
	for _, n := range nodes.Nodes() {
		in := &n.Info
		if !in.Alive || in.Draining || (m.Model != "" && in.Model != m.Model && !strings.HasPrefix(m.Model, in.Model+":")) ||
			s.svc.Ejected(in.ID) {
			continue
		}
		if tried == requests.EngineTokenizeAttempts {
			break
		}
		tried++
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.EngineURL+r.URL.Path, nil)
		if err != nil {
			continue
		}
		// The pooled body, held by the upstream request until the Transport closes it (it may
		// still be writing it after the answer came).
		rb.Attach(req)
		req.Header.Set("Content-Type", "application/json")
		if a := r.Header.Get("Authorization"); a != "" {
			req.Header.Set("Authorization", a)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			s.svc.Health().ReportFailure(in.ID)
			continue
		}
		defer resp.Body.Close()
		for _, k := range []string{"Content-Type", "Retry-After"} {
			if v := resp.Header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		w.Header().Set(HeaderNode, in.ID)
		if (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", retryAfterSeconds)
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, requests.MaxTokenizeResponseBytes))
		return
	}
	writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can serve "+r.URL.Path)
}

// withCORS answers browsers from the configured origins: the CORS headers on every response and
// 204 to preflight requests.
func (s *Server) withCORS(h http.Handler) http.Handler {
	if len(s.cfg.CORSOrigins) == 0 {
		return h
	}
	anyOrigin := slices.Contains(s.cfg.CORSOrigins, "*")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin != "" && (anyOrigin || slices.Contains(s.cfg.CORSOrigins, origin)) {
			hd := w.Header()
			if anyOrigin {
				hd.Set("Access-Control-Allow-Origin", "*")
			} else {
				hd.Set("Access-Control-Allow-Origin", origin)
				hd.Add("Vary", "Origin")
			}
			hd.Set("Access-Control-Expose-Headers", strings.Join([]string{HeaderNode, HeaderEstimate, HeaderEstimateTiers, requests.HeaderCachedTokens, "Retry-After"}, ", "))
			if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
				hd.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
				hd.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id, "+requests.HeaderSessionID)
				hd.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// noRedirects answers a path ServeMux would redirect (unclean: "//", "/./", "/../", or a
// trailing slash) with a 404 naming the path to use: a 301 drops a POST's body, and clients
// report it as a confusing failure.
func noRedirects(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		c := p
		if !strings.HasPrefix(c, "/") {
			c = "/" + c
		}
		// Clean of a clean path is the path itself, without allocating.
		if c = path.Clean(c); p != c && r.Method != http.MethodConnect {
			writeError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no route for %s %s; did you mean %s?", r.Method, p, c))
			return
		}
		h.ServeHTTP(w, r)
	})
}
