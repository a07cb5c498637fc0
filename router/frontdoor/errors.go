package frontdoor

import (
	"errors"
	"net/http"

	"github.com/prefixmesh/prefixmesh/internal/openai"
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

// Error codes the front door itself answers with.
const (
	codeInvalid       = openai.CodeInvalid
	codeTooLarge      = "request_too_large"
	codeNotFound      = "not_found"
	codeModelNotFound = "model_not_found"
	codeMethod        = "method_not_allowed"
	codeOverloaded    = "router_overloaded"
	codeNoNodes       = "no_nodes_available"
	codeUpstream      = "upstream_unavailable"
	codeDraining      = "router_draining"
	codeTokenize      = "tokenize_failed"
	codeBodyTimeout   = "request_timeout"
)

// writeError writes an OpenAI-shaped error (internal/openai: param null, Retry-After on 429
// and 503).
func writeError(w http.ResponseWriter, status int, code, msg string) {
	openai.WriteError(w, &openai.Error{Status: status, Code: code, Message: msg})
}
