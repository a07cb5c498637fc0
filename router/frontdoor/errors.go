package frontdoor

import (
	"encoding/json"
	"errors"
	"net/http"
)

// Sentinel errors of the package; callers test them with errors.Is.
var (
	// ErrNoNodes: no node can serve the request (503).
	ErrNoNodes = errors.New("frontdoor: no node can serve the request")
	// ErrOverloaded: every candidate is over its load bound, or the router's own in-flight cap
	// is reached (429).
	ErrOverloaded = errors.New("frontdoor: overloaded")
	// ErrDraining: the front door is shutting down (503).
	ErrDraining = errors.New("frontdoor: draining")
	// ErrConfig is wrapped by every Validate error.
	ErrConfig = errors.New("frontdoor: invalid config")
)

// apiError is the OpenAI error body: {"error": {"message", "type", "code"}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// Error codes the front door itself answers with.
const (
	codeInvalid       = "invalid_request"
	codeTooLarge      = "request_too_large"
	codeNotFound      = "not_found"
	codeModelNotFound = "model_not_found"
	codeMethod        = "method_not_allowed"
	codeOverloaded    = "router_overloaded"
	codeNoNodes       = "no_nodes_available"
	codeUpstream      = "upstream_unavailable"
	codeDraining      = "router_draining"
	codeTokenize      = "tokenize_failed"
)

// errorType is OpenAI's error type for a status.
func errorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// writeError writes an OpenAI-shaped error.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	// The client may be gone; nothing to do about a write error.
	_ = json.NewEncoder(w).Encode(apiError{Error: apiErrorBody{Message: msg, Type: errorType(status), Code: code}})
}
